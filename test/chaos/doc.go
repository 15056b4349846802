// Package chaos runs fencekeeper's failure matrix on a replicated control
// plane (make chaos, docs/chaos.md): three etcd members, two kube-apiservers
// with a webhook front end each, two operator replicas and the workers, each
// process in its own network namespace; a nemesis that partitions, kills,
// pauses, degrades links and skews clocks on a seeded schedule; workers that
// use pkg/lockclient as users do, and two adversaries; and a checker that
// reads everything back from etcd, the API servers' watches and the
// workers' logs and trusts none of fencekeeper's code.
package chaos
