package grant

import "strings"

// PodLeasePrefix starts the lease of a grant bound to the pod that asked for
// it: "pod:<pod UID>". The pod UID comes from the requester's bound
// service-account token (the API server puts it in the request's user info),
// so replicas that share a ServiceAccount get grants only their own pod can use.
const PodLeasePrefix = "pod:"

// PodLease is the lease of a grant requested from the pod with UID podUID.
func PodLease(podUID string) string { return PodLeasePrefix + podUID }

// LeasePod returns the pod a lease binds its grant to, and whether it binds one.
func LeasePod(lease string) (string, bool) { return strings.CutPrefix(lease, PodLeasePrefix) }

// LeaseAdmits reports whether a request from pod (its pod UID; "" for a
// request that carries no pod: a person, kubectl, a worker outside the
// cluster) may act under a grant with this lease. A lease that names no pod
// admits every request of the owner; a pod-bound lease admits only its pod.
func LeaseAdmits(lease, pod string) bool {
	bound, ok := LeasePod(lease)
	return !ok || bound == pod
}

// DescribePod names a request's pod in messages.
func DescribePod(pod string) string {
	if pod == "" {
		return "no pod"
	}
	return "pod " + pod
}
