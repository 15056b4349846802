package webhooks

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

const testOperator = "system:serviceaccount:fencekeeper-system:fencekeeper-controller-manager"

func heldGrant() *locksv1.LockGrant {
	return &locksv1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Name: "batch-r", Namespace: "team", ResourceVersion: "7", Generation: 1,
			Finalizers:  []string{locksv1.GrantFinalizer},
			Annotations: map[string]string{locksv1.AnnotationUnresolvedMutation: `{"object":"ConfigMap/x"}`}},
		Spec:   locksv1.LockGrantSpec{Resource: "batch", Owner: "worker-a", RequestID: "r", Lease: "l", OperationRoot: "sha256:00"},
		Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld},
	}
}

func paths(ps []*field.Path) string { return joinPaths(ps) }

func TestLockGrantChanges(t *testing.T) {
	now := metav1.Now()
	grace := int64(0)
	cases := map[string]struct {
		mutate func(*locksv1.LockGrant)
		want   string
	}{
		"nothing": {func(*locksv1.LockGrant) {}, ""},
		"server bookkeeping": {func(g *locksv1.LockGrant) {
			g.ResourceVersion, g.Generation = "8", 2
			g.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
			g.DeletionTimestamp, g.DeletionGracePeriodSeconds = &now, &grace
		}, ""},
		"status is not the main resource's": {func(g *locksv1.LockGrant) { g.Status.Phase = locksv1.PhaseReleased }, ""},
		"annotation removed":                {func(g *locksv1.LockGrant) { g.Annotations = nil }, "metadata.annotations[fencekeeper.dev/unresolved-mutation]"},
		"label added":                       {func(g *locksv1.LockGrant) { g.Labels = map[string]string{"team": "b"} }, "metadata.labels[team]"},
		"annotation changed and added": {func(g *locksv1.LockGrant) {
			g.Annotations = map[string]string{locksv1.AnnotationUnresolvedMutation: "{}", "a": "b"}
		}, "metadata.annotations[a], metadata.annotations[fencekeeper.dev/unresolved-mutation]"},
		"finalizer removed": {func(g *locksv1.LockGrant) { g.Finalizers = nil }, "metadata.finalizers"},
		"owner reference": {func(g *locksv1.LockGrant) {
			g.OwnerReferences = []metav1.OwnerReference{{Kind: "FencedResource", Name: "batch"}}
		}, "metadata.ownerReferences"},
		"generateName": {func(g *locksv1.LockGrant) { g.GenerateName = "x-" }, "metadata"},
		"renewal and release": {func(g *locksv1.LockGrant) { g.Spec.Renewals, g.Spec.Release = 1, true },
			"spec.renewals, spec.release"},
		"immutable spec": {func(g *locksv1.LockGrant) { g.Spec.Lease = "other" }, "spec"},
		"several": {func(g *locksv1.LockGrant) { g.Labels = map[string]string{"a": "b"}; g.Spec.Release = true },
			"metadata.labels[a], spec.release"},
	}
	for name, c := range cases {
		newLG := heldGrant()
		c.mutate(newLG)
		if got := paths(lockGrantChanges(heldGrant(), newLG)); got != c.want {
			t.Errorf("%s: changes %q, want %q", name, got, c.want)
		}
	}
}

func TestLockGrantChangesOfTerminatingGrant(t *testing.T) {
	now := metav1.Now()
	terminating := func(finalizers ...string) *locksv1.LockGrant {
		g := heldGrant()
		g.DeletionTimestamp, g.Finalizers = &now, finalizers
		return g
	}
	gc := terminating(locksv1.GrantFinalizer, metav1.FinalizerOrphanDependents, metav1.FinalizerDeleteDependents)
	if got := paths(lockGrantChanges(gc, terminating(locksv1.GrantFinalizer))); got != "" {
		t.Errorf("the garbage collector's finalizers on a terminating grant counted as %q", got)
	}
	if got := paths(lockGrantChanges(gc, terminating(metav1.FinalizerOrphanDependents))); got != "metadata.finalizers" {
		t.Errorf("removing the release finalizer of a terminating grant: %q, want metadata.finalizers", got)
	}
	live := heldGrant()
	live.Finalizers = append(live.Finalizers, metav1.FinalizerOrphanDependents)
	if got := paths(lockGrantChanges(live, heldGrant())); got != "metadata.finalizers" {
		t.Errorf("removing orphan from a live grant: %q, want metadata.finalizers", got)
	}
}

func TestAuthorizeLockGrant(t *testing.T) {
	annotations := []*field.Path{field.NewPath("metadata", "annotations")}
	twoFields := []*field.Path{field.NewPath("metadata", "labels"), field.NewPath("spec", "release")}
	call := func(user string, del bool, changes []*field.Path, mutate ...func(*lockGrantCall)) lockGrantCall {
		c := lockGrantCall{User: user, Owner: "worker-a", Operator: testOperator, Delete: del, Changes: changes}
		for _, m := range mutate {
			m(&c)
		}
		return c
	}
	terminating := func(c *lockGrantCall) { c.NamespaceTerminating = true }
	breakGlass := func(c *lockGrantCall) { c.BreakGlass = true }
	podBound := func(c *lockGrantCall) { c.Lease = grant.PodLease("uid-a") }
	fromPod := func(pod string) func(*lockGrantCall) { return func(c *lockGrantCall) { c.Pod = pod } }
	cases := map[string]struct {
		call    lockGrantCall
		via     lockGrantAuthority
		foreign bool
		denied  []string // field paths of the Forbidden errors
	}{
		"no-op update by anyone":               {call("worker-b", false, nil), viaNoChange, false, nil},
		"owner deletes":                        {call("worker-a", true, nil), viaOwner, false, nil},
		"owner changes annotations":            {call("worker-a", false, annotations), viaOwner, false, nil},
		"operator removes the finalizer":       {call(testOperator, false, []*field.Path{field.NewPath("metadata", "finalizers")}), viaOperator, false, nil},
		"operator deletes":                     {call(testOperator, true, nil), viaOperator, false, nil},
		"co-tenant deletes":                    {call("worker-b", true, nil), "", true, []string{"spec.owner"}},
		"co-tenant changes annotations":        {call("worker-b", false, annotations), "", true, []string{"metadata.annotations"}},
		"co-tenant changes two fields":         {call("worker-b", false, twoFields), "", true, []string{"metadata.labels", "spec.release"}},
		"break-glass deletes":                  {call("oncall", true, nil, breakGlass), viaBreakGlass, true, nil},
		"break-glass changes":                  {call("oncall", false, annotations, breakGlass), viaBreakGlass, true, nil},
		"namespace controller, terminating":    {call(locksv1.NamespaceControllerUsername, true, nil, terminating), viaNamespaceDeletion, true, nil},
		"namespace controller, live namespace": {call(locksv1.NamespaceControllerUsername, true, nil), "", true, []string{"spec.owner"}},
		"namespace controller may only delete": {call(locksv1.NamespaceControllerUsername, false, annotations, terminating), "", true, []string{"metadata.annotations"}},
		"terminating namespace is no licence":  {call("worker-b", true, nil, terminating), "", true, []string{"spec.owner"}},
		"the pod of a pod-bound request":       {call("worker-a", false, twoFields, podBound, fromPod("uid-a")), viaOwner, false, nil},
		"another pod releases":                 {call("worker-a", false, twoFields, podBound, fromPod("uid-b")), "", true, []string{"metadata.labels", "spec.release"}},
		"another pod deletes":                  {call("worker-a", true, nil, podBound, fromPod("uid-b")), "", true, []string{"spec.owner"}},
		"the owner without a pod deletes":      {call("worker-a", true, nil, podBound), "", true, []string{"spec.owner"}},
		"any pod of an unbound request":        {call("worker-a", true, nil, fromPod("uid-b")), viaOwner, false, nil},
	}
	for name, c := range cases {
		if got := c.call.foreign(); got != c.foreign {
			t.Errorf("%s: foreign = %v, want %v", name, got, c.foreign)
		}
		via, errs := authorizeLockGrant(c.call)
		if via != c.via {
			t.Errorf("%s: admitted via %q, want %q", name, via, c.via)
		}
		var got []string
		for _, e := range errs {
			got = append(got, e.Field)
			if e.Type != field.ErrorTypeForbidden || !strings.Contains(e.Detail, `"worker-a"`) || !strings.Contains(e.Detail, `"`+c.call.User+`"`) {
				t.Errorf("%s: error %v must be Forbidden and name the owner and the requester", name, e)
			}
		}
		if strings.Join(got, ",") != strings.Join(c.denied, ",") {
			t.Errorf("%s: denied %v, want %v", name, got, c.denied)
		}
	}
}

func TestLeaseViolation(t *testing.T) {
	for _, c := range []struct {
		lease, pod, want string
	}{
		{"lease-1", "", ""},
		{grant.PodLease("uid-a"), "uid-a", ""},
		{"lease-1", "uid-a", `must be "pod:uid-a"`},
		{grant.PodLease("uid-b"), "uid-a", `must be "pod:uid-a"`},
		{grant.PodLease("uid-a"), "", `must not start with "pod:"`},
	} {
		got := leaseViolation(c.lease, c.pod)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("leaseViolation(%q, %q) = %q, want %q", c.lease, c.pod, got, c.want)
		}
	}
}

func TestValidateLockGrantSpecUpdate(t *testing.T) {
	cases := map[string]struct {
		mutate func(*locksv1.LockGrantSpec)
		want   string
	}{
		"renew":              {func(s *locksv1.LockGrantSpec) { s.Renewals = 3 }, ""},
		"release":            {func(s *locksv1.LockGrantSpec) { s.Release = true }, ""},
		"renewals shrink":    {func(s *locksv1.LockGrantSpec) { s.Renewals = 1 }, "spec.renewals: Invalid value: 1: may only grow (was 2)"},
		"release undone":     {func(s *locksv1.LockGrantSpec) { s.Release = false }, "spec.release: Invalid value: false: cannot be undone"},
		"owner changes":      {func(s *locksv1.LockGrantSpec) { s.Owner = "worker-b" }, `spec.owner: Invalid value: "worker-b": is immutable (was "worker-a")`},
		"resource changes":   {func(s *locksv1.LockGrantSpec) { s.Resource = "other" }, "spec.resource"},
		"requestID changes":  {func(s *locksv1.LockGrantSpec) { s.RequestID = "x" }, "spec.requestID"},
		"lease changes":      {func(s *locksv1.LockGrantSpec) { s.Lease = "x" }, "spec.lease"},
		"root changes":       {func(s *locksv1.LockGrantSpec) { s.OperationRoot = "sha256:11" }, "spec.operationRoot"},
		"category changes":   {func(s *locksv1.LockGrantSpec) { s.OperationCategory = "x" }, "spec.operationCategory"},
		"no change is valid": {func(*locksv1.LockGrantSpec) {}, ""},
	}
	for name, c := range cases {
		oldLG := heldGrant()
		oldLG.Spec.Renewals = 2
		if name == "release undone" {
			oldLG.Spec.Release = true
		}
		newLG := oldLG.DeepCopy()
		c.mutate(&newLG.Spec)
		errs := validateLockGrantSpecUpdate(oldLG, newLG)
		if (c.want == "") != (len(errs) == 0) || (len(errs) > 0 && !strings.Contains(errs.ToAggregate().Error(), c.want)) {
			t.Errorf("%s: got %v, want %q", name, errs, c.want)
		}
	}
}

func validRecord(t *testing.T) string {
	t.Helper()
	raw, err := locksv1.UnresolvedMutation{Object: "ConfigMap/x", Operation: "op", Fence: 1, Segment: 1,
		Payload: "sha256:" + strings.Repeat("0", 64), Since: metav1.Now().UTC()}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// withBlob sets annotation example.com/blob so that g's attached metadata is size bytes.
func withBlob(g *locksv1.LockGrant, size int) *locksv1.LockGrant {
	delete(g.Annotations, "example.com/blob")
	if g.Annotations == nil {
		g.Annotations = map[string]string{}
	}
	g.Annotations["example.com/blob"] = strings.Repeat("x", size-attachedMetadataBytes(&g.ObjectMeta)-len("example.com/blob"))
	return g
}

func TestAttachedMetadataBytes(t *testing.T) {
	m := metav1.ObjectMeta{Labels: map[string]string{"ab": "c"}, Annotations: map[string]string{"d": "ef"},
		Finalizers: []string{"gh"}, OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "K", Name: "n", UID: "u"}}}
	if got := attachedMetadataBytes(&m); got != 3+3+2+5 {
		t.Errorf("attachedMetadataBytes = %d, want 13", got)
	}
}

func TestValidateAttachedMetadata(t *testing.T) {
	const budget = locksv1.MaxLockGrantMetadataBytes
	fresh := func() *locksv1.LockGrant { g := heldGrant(); g.Annotations = nil; return g }
	withRecord := func(g *locksv1.LockGrant, v string) *locksv1.LockGrant {
		metav1.SetMetaDataAnnotation(&g.ObjectMeta, locksv1.AnnotationUnresolvedMutation, v)
		return g
	}
	record := validRecord(t)
	cases := map[string]struct {
		old, new *locksv1.LockGrant
		want     string // "" admits; else a substring of the errors
	}{
		"create at the budget":            {nil, withBlob(fresh(), budget), ""},
		"create over the budget":          {nil, withBlob(fresh(), budget+1), "metadata: Invalid value: \"16385 bytes\": the labels, annotations, finalizers and ownerReferences of a LockGrant may hold at most 16384 bytes"},
		"update over the budget":          {fresh(), withBlob(fresh(), budget+1), "at most 16384 bytes together (keys and values); these hold 16385 bytes"},
		"over the budget, shrinking":      {withBlob(fresh(), 3*budget), withBlob(fresh(), 2*budget), ""},
		"over the budget, growing":        {withBlob(fresh(), 2*budget), withBlob(fresh(), 2*budget+1), "these hold 32769 bytes"},
		"create with a valid record":      {nil, withRecord(fresh(), record), ""},
		"create with garbage":             {nil, withRecord(fresh(), "{not json"), "metadata.annotations[fencekeeper.dev/unresolved-mutation]: Invalid value: not an unresolved-mutation record: invalid character"},
		"garbage written":                 {fresh(), withRecord(fresh(), `{"object":"ConfigMap/x"}`), "operation must be 1..253 bytes"},
		"garbage replacing a record":      {withRecord(fresh(), record), withRecord(fresh(), "x"), "not an unresolved-mutation record"},
		"stored garbage left as it is":    {withRecord(fresh(), "x"), withRecord(withBlob(fresh(), 100), "x"), ""},
		"stored garbage removed":          {withRecord(fresh(), "x"), fresh(), ""},
		"over the record's bound, and it": {nil, withRecord(fresh(), strings.Repeat(" ", 5000)), "5000 bytes, more than 4096"},
	}
	for name, c := range cases {
		got := validateAttachedMetadata(c.old, c.new).ToAggregate()
		switch {
		case c.want == "" && got != nil:
			t.Errorf("%s: refused: %v", name, got)
		case c.want != "" && (got == nil || !strings.Contains(got.Error(), c.want)):
			t.Errorf("%s: got %v, want an error containing %q", name, got, c.want)
		}
	}
}

func TestValidateLockGrantUpdateJudgesOnlyTheOwnersMetadata(t *testing.T) {
	old, garbage := heldGrant(), heldGrant()
	garbage.Annotations[locksv1.AnnotationUnresolvedMutation] = "{not json"
	for via, refused := range map[lockGrantAuthority]bool{viaOwner: true, viaBreakGlass: false, viaOperator: false} {
		if errs := validateLockGrantUpdate(via, old, garbage); (len(errs) > 0) != refused {
			t.Errorf("%s writing a garbage record: errors %v, want refused=%v", via, errs, refused)
		}
	}
	released := heldGrant()
	released.Spec.Release, old.Spec.Release = false, true
	if errs := validateLockGrantUpdate(viaBreakGlass, old, released); len(errs) == 0 {
		t.Error("break-glass undid a release: the spec's rules hold whoever asks")
	}
}
