package envtest

import (
	"strings"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// eventsOf lists the notes of the Events with reason about the object name in ns.
func eventsOf(ns, name, reason string) []string {
	var list corev1.EventList
	Expect(admin.List(suiteCtx, &list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason {
			out = append(out, e.Message)
		}
	}
	return out
}

// deniedVerdicts lists the verdict codes of the WriteDenied Events about obj:
// the reason is CamelCase and the note starts with the code.
func deniedVerdicts(ns, name string) []string {
	var out []string
	for _, note := range eventsOf(ns, name, locksv1.EventReasonWriteDenied) {
		code, _, _ := strings.Cut(note, ":")
		out = append(out, code)
	}
	return out
}
