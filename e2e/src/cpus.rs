//! Each node's own cores. Separate machines do not share cores, but this cluster's
//! nodes all run on this one. Pinned to a share of its CPUs (`sched_setaffinity`, which
//! the agent's pods inherit), a node's trainers see that many cores and start that many
//! threads, as on a node of their own; unpinned, every node's OpenMP threads spin on
//! every core, and two 1-process nodes on 2 cores train 4× slower.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// The CPUs this process may run on.
pub fn host_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is the empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the size is the set's.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: CPU_ISSET reads a set we own, below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Node `node` of `nodes` in the `cluster`-th cluster of this process: an equal share
/// of `host` (at least one CPU), the clusters' nodes laid round the CPUs in turn so two
/// clusters at once spread too. Empty when `host` is.
pub fn node_share(host: &[usize], nodes: usize, cluster: usize, node: usize) -> Vec<usize> {
    if host.is_empty() {
        return Vec::new();
    }
    let share = (host.len() / nodes.max(1)).max(1);
    let start = (cluster * nodes + node) * share;
    (start..start + share).map(|k| host[k % host.len()]).collect()
}

/// Starts `cmd` on `cpus` only (no change when empty).
pub fn pin(cmd: &mut Command, cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes below CPU_SETSIZE.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: sched_setaffinity is async-signal-safe and reads only the copied set.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Case<'a> {
        host: &'a [usize],
        nodes: usize,
        cluster: usize,
        node: usize,
        cpus: Vec<usize>,
    }

    #[test]
    fn nodes_share_the_cpus_and_two_clusters_spread() {
        let two = [0, 1];
        let sixteen: Vec<usize> = (0..16).collect();
        let case = |host, nodes, cluster, node, cpus| Case { host, nodes, cluster, node, cpus };
        let cases = [
            case(&two, 2, 0, 0, vec![0]),
            case(&two, 2, 0, 1, vec![1]),
            case(&two, 1, 0, 0, vec![0, 1]),
            case(&two, 1, 1, 0, vec![0, 1]),
            case(&[0, 1, 2], 2, 1, 1, vec![0]),
            case(&sixteen, 2, 0, 1, (8..16).collect()),
            case(&sixteen, 4, 1, 0, vec![0, 1, 2, 3]),
            case(&[], 2, 0, 0, vec![]),
        ];
        for c in cases {
            let got = node_share(c.host, c.nodes, c.cluster, c.node);
            assert_eq!(got, c.cpus, "{:?}, {} nodes, cluster {}, node {}", c.host, c.nodes, c.cluster, c.node);
        }
    }

    #[test]
    fn a_pinned_child_sees_only_its_cpus() {
        let host = host_cpus();
        assert!(!host.is_empty(), "sched_getaffinity");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "grep Cpus_allowed_list /proc/self/status"]);
        pin(&mut cmd, &host[..1]);
        let out = String::from_utf8(cmd.output().expect("sh").stdout).unwrap();
        assert_eq!(out.split_whitespace().last(), Some(host[0].to_string().as_str()), "{out}");
    }
}
