package fence

import (
	"maps"
	"strings"
	"testing"

	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// target is a protected object of entry "inv" holding st's annotations.
func target(st map[string]string, content string) *Object {
	ann := map[string]string{AnnotationResource: "inv"}
	maps.Copy(ann, st)
	return &Object{Kind: "ConfigMap", Name: "inv", Labels: map[string]string{LabelProtected: "true"}, Annotations: ann, Payload: payload(content)}
}

var invEntry = Entry{Name: "inv", ResourceID: resourceID}

// stamped is o after the holder stamped segment seg of g with content v.
func (w *world) stamped(o *Object, g grant.Grant, seg int64, v string) *Object {
	w.t.Helper()
	n := &Object{Kind: o.Kind, Name: o.Name, Labels: maps.Clone(o.Labels), Annotations: maps.Clone(o.Annotations), Payload: payload(v)}
	env, err := ParseEnvelope(w.envelope(g, seg, payload(v)))
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := Stamp(n.Annotations, env); err != nil {
		w.t.Fatal(err)
	}
	return n
}

func TestDecideWrite(t *testing.T) {
	w := newWorld(t)
	a := w.grant("worker-a", 5, rootOf('a'))
	trust := Trust{Grants: w.bundle, Stored: w.bundle}
	reg := held(a)
	// The stored object accepted a's segment 1.
	first := w.stamped(target(nil, "v0"), a, 1, "a1")
	if d, _ := DecideWrite(Write{Operation: OpCreate, User: "worker-a", New: first}, invEntry, reg, trust); d.Verdict != Accepted {
		t.Fatalf("setup: %s", d.Message)
	}
	update := func(mutate func(n *Object)) Write {
		n := w.stamped(first, a, 2, "a2")
		if mutate != nil {
			mutate(n)
		}
		return Write{Operation: OpUpdate, User: "worker-a", Old: first, New: n, Changed: true}
	}
	dropLabel := func(n *Object) { delete(n.Labels, LabelProtected) }
	cases := []struct {
		name  string
		write Write
		entry Entry
		want  Verdict
		says  string
	}{
		{"the next segment", update(nil), invEntry, Accepted, ""},
		{"the label dropped under the current grant", update(dropLabel), invEntry, ProtectionRemoved, "must carry the label"},
		{"the entry's annotation changed", update(func(n *Object) { n.Annotations[AnnotationResource] = "other" }), invEntry, ProtectionRemoved, "must carry the annotation"},
		{"the receipt log rewritten", update(func(n *Object) { n.Annotations[AnnotationReceipts] = "[]" }), invEntry, ReceiptLogMismatch, "stored log plus"},
		{"the receipt log unreadable", update(func(n *Object) { n.Annotations[AnnotationReceipts] = "{" }), invEntry, ReceiptLogMismatch, ""},
		{"a scale write", Write{Operation: OpUpdate, Subresource: "scale", User: "worker-a", Old: &Object{}, New: &Object{}}, invEntry, FenceRequired, "scale subresource"},
		{"an unchanged update", Write{Operation: OpUpdate, User: "worker-a", Old: first, New: first}, invEntry, Unchanged, ""},
		{"a delete not declared", Write{Operation: OpDelete, User: "worker-a", Old: first}, invEntry, DeleteNotDeclared, ""},
		// The first fenced write of a target that never carried the marks must add them.
		{"marks never added", Write{Operation: OpCreate, User: "worker-a", New: func() *Object {
			o := w.stamped(target(nil, "v0"), a, 1, "a1")
			delete(o.Labels, LabelProtected)
			return o
		}()}, invEntry, ProtectionRemoved, "must carry the label"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, _ := DecideWrite(c.write, c.entry, reg, trust)
			if d.Verdict != c.want || !strings.HasPrefix(d.Message, string(c.want)) || !strings.Contains(d.Message, c.says) {
				t.Fatalf("%s %q, want %s saying %q", d.Verdict, d.Message, c.want, c.says)
			}
		})
	}
}

// Stored fence state counts only when the acceptance point can have accepted
// it: bound to this entry and verifying; a recreated target continues its
// deleted state; nothing falls below the highest fence the registry saw.
func TestTrustedState(t *testing.T) {
	w := newWorld(t)
	a := w.grant("worker-a", 5, rootOf('a'))
	genuine := w.stamped(target(nil, "v0"), a, 1, "a1")
	if st := TrustedState(genuine, invEntry, w.bundle); st.HighestFence != 5 || st.LastSegment != 1 || len(st.Receipts) != 1 {
		t.Fatalf("a genuine state: %+v", st)
	}
	other := invEntry
	other.ResourceID = "another/resource"
	if st := TrustedState(genuine, other, w.bundle); st.HighestFence != 0 || st.Receipts != nil {
		t.Fatalf("another resource's state counted: %+v", st)
	}
	planted := target(map[string]string{AnnotationFence: strings.Replace(genuine.Annotations[AnnotationFence], `"fenceToken":5`, `"fenceToken":9`, 1)}, "x")
	if st := TrustedState(planted, invEntry, w.bundle); st.HighestFence != 0 {
		t.Fatalf("a tampered state counted: %+v", st)
	}
	deleted := invEntry
	deleted.DeletedTarget = &State{HighestFence: 5, Root: rootOf('a'), LastSegment: 3}
	if st := TrustedState(nil, deleted, w.bundle); st.LastSegment != 3 {
		t.Fatalf("a recreated target does not continue its deleted state: %+v", st)
	}
	seen := invEntry
	seen.HighestObservedFence = 7
	if st := TrustedState(genuine, seen, w.bundle); st.HighestFence != 7 || st.Root != "" {
		t.Fatalf("below the highest fence seen: %+v", st)
	}
}

// A status write carries no fence: it may change none of fencekeeper's marks.
func TestDecideStatusWrite(t *testing.T) {
	stored := func() *Object {
		return &Object{Kind: "Deployment", Name: "web", Labels: map[string]string{LabelProtected: "true", "app": "web"},
			Annotations: map[string]string{AnnotationResource: "web", AnnotationFence: "{f}", AnnotationReceipts: "[r]", "team": "a"}}
	}
	annotate := func(key, value string, drop bool) func(o *Object) {
		return func(o *Object) {
			if drop {
				delete(o.Annotations, key)
			} else {
				o.Annotations[key] = value
			}
		}
	}
	cases := map[string]struct {
		old, write func(o *Object)
		want       Verdict
		names      string // in the message
	}{
		"status only":        {write: func(*Object) {}, want: Unchanged},
		"another annotation": {write: annotate("team", "b", false), want: Unchanged},
		"fence planted":      {write: annotate(AnnotationFence, "{g}", false), want: FenceRequired, names: AnnotationFence},
		"fence removed":      {write: annotate(AnnotationFence, "", true), want: FenceRequired, names: AnnotationFence},
		"fence emptied":      {write: annotate(AnnotationFence, "", false), want: FenceRequired, names: AnnotationFence},
		"receipts stripped":  {write: annotate(AnnotationReceipts, "", true), want: FenceRequired, names: AnnotationReceipts},
		"resource elsewhere": {write: annotate(AnnotationResource, "other", false), want: ProtectionRemoved, names: "must carry the annotation"},
		"resource dropped":   {write: annotate(AnnotationResource, "", true), want: ProtectionRemoved, names: "must carry the annotation"},
		"label dropped": {write: func(o *Object) { o.Labels = map[string]string{"app": "web"} },
			want: ProtectionRemoved, names: "must carry the label"},
		// Never protected by its marks yet: adding them needs a fenced write.
		"marks added": {old: annotate(AnnotationResource, "", true), write: annotate(AnnotationResource, "web", false),
			want: FenceRequired, names: AnnotationResource},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			old := stored()
			if c.old != nil {
				c.old(old)
			}
			n := &Object{Kind: old.Kind, Name: old.Name, Labels: maps.Clone(old.Labels), Annotations: maps.Clone(old.Annotations)}
			c.write(n)
			e := Entry{Name: "web", ResourceID: resourceID, HighestObservedFence: 3}
			d, st := DecideWrite(Write{Operation: OpUpdate, Subresource: SubresourceStatus, Old: old, New: n}, e, Registry{}, Trust{})
			if d.Verdict != c.want || !strings.HasPrefix(d.Message, string(c.want)+":") || !strings.Contains(d.Message, c.names) {
				t.Fatalf("DecideWrite = %s %q, want %s naming %q", d.Verdict, d.Message, c.want, c.names)
			}
			if d.State.HighestFence != 3 || st.HighestFence != 3 {
				t.Fatalf("the decision changed the stored state: %+v, %+v", d.State, st)
			}
		})
	}
}

func TestFenceStateChange(t *testing.T) {
	old := target(map[string]string{AnnotationFence: "{f}", AnnotationReceipts: "[r]"}, "x")
	with := func(k, v string) *Object {
		n := &Object{Annotations: maps.Clone(old.Annotations)}
		if v == "" {
			delete(n.Annotations, k)
		} else {
			n.Annotations[k] = v
		}
		return n
	}
	for _, c := range []struct {
		name            string
		w               Write
		writes, changes bool
	}{
		{"unchanged", Write{Old: old, New: with("team", "a")}, false, false},
		{"fence written", Write{Old: old, New: with(AnnotationFence, "{g}")}, true, true},
		{"receipts removed", Write{Old: old, New: with(AnnotationReceipts, "")}, false, true},
		{"planted on a create", Write{New: with(AnnotationFence, "{g}")}, true, true},
		{"status write", Write{Subresource: SubresourceStatus, Old: old, New: with(AnnotationFence, "{g}")}, true, true},
		{"a scale's object is not the target's", Write{Subresource: "scale", Old: old, New: with(AnnotationFence, "{g}")}, false, false},
		{"a delete", Write{Old: old}, false, false},
	} {
		if writes, changes := c.w.FenceStateChange(); writes != c.writes || changes != c.changes {
			t.Errorf("%s: writes %v changes %v, want %v %v", c.name, writes, changes, c.writes, c.changes)
		}
	}
}
