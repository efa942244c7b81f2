// argocd-health evaluates a TrainingRun health check (deploy/argocd/health.lua) as
// Argo CD does: registered as the resource customization of
// training.puretransformer.dev/TrainingRun (argocd-cm's
// resource.customizations.health.training.puretransformer.dev_TrainingRun) and run by
// Argo CD's own Lua VM (util/lua). It reads a JSON list of objects on stdin and prints
// one JSON line per object: {"name", "status", "message"}.
//
//	argocd-health deploy/argocd/health.lua < runs.json
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: argocd-health <health.lua> < objects.json")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "argocd-health: %v\n", err)
		os.Exit(2)
	}
	var objects []map[string]any
	if err := json.NewDecoder(os.Stdin).Decode(&objects); err != nil {
		fmt.Fprintf(os.Stderr, "argocd-health: stdin: %v\n", err)
		os.Exit(2)
	}
	overrides := lua.ResourceHealthOverrides{
		"training.puretransformer.dev/TrainingRun": v1alpha1.ResourceOverride{HealthLua: string(script)},
	}
	out := json.NewEncoder(os.Stdout)
	for _, o := range objects {
		obj := &unstructured.Unstructured{Object: o}
		h, err := overrides.GetResourceHealth(obj)
		line := map[string]string{"name": obj.GetName()}
		switch {
		case err != nil:
			line["error"] = err.Error()
		case h == nil:
			line["error"] = "no health script applies"
		default:
			line["status"] = string(h.Status)
			line["message"] = h.Message
		}
		if err := out.Encode(line); err != nil {
			os.Exit(1)
		}
	}
}
