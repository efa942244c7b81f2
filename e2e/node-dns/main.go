// CoreDNS with only the plugins the test clusters' Corefile uses
// (e2e/src/test_cluster/dns.rs), as CoreDNS documents for a build of chosen plugins:
// the main package imports them and lists their directives in plugin.cfg's order. The
// stock build links every plugin, and with them the cloud providers' SDKs.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The directives of the plugins above, in the order of CoreDNS's plugin.cfg: the order
// a query passes through them.
var directives = []string{"ready", "health", "errors", "loadbalance", "kubernetes"}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
