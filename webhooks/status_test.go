package webhooks

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

func TestDecideStatus(t *testing.T) {
	fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Name: "web"}}
	stored := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "Deployment",
			"status": map[string]any{"replicas": int64(1)}}}
		u.SetName("web")
		u.SetLabels(map[string]string{fence.LabelProtected: "true", "app": "web"})
		u.SetAnnotations(map[string]string{fence.AnnotationResource: "web", fence.AnnotationFence: "{f}", fence.AnnotationReceipts: "[r]", "team": "a"})
		return u
	}
	annotate := func(key, value string, drop bool) func(u *unstructured.Unstructured) {
		return func(u *unstructured.Unstructured) {
			ann := u.GetAnnotations()
			if drop {
				delete(ann, key)
			} else {
				ann[key] = value
			}
			u.SetAnnotations(ann)
		}
	}
	cases := map[string]struct {
		old, write func(u *unstructured.Unstructured)
		want       fence.Verdict
		names      string // in the message
	}{
		"status only": {write: func(u *unstructured.Unstructured) {
			u.Object["status"] = map[string]any{"replicas": int64(2)}
		}, want: fence.Unchanged},
		"another annotation": {write: annotate("team", "b", false), want: fence.Unchanged},
		"fence planted":      {write: annotate(fence.AnnotationFence, "{g}", false), want: fence.FenceRequired, names: fence.AnnotationFence},
		"fence removed":      {write: annotate(fence.AnnotationFence, "", true), want: fence.FenceRequired, names: fence.AnnotationFence},
		"fence emptied":      {write: annotate(fence.AnnotationFence, "", false), want: fence.FenceRequired, names: fence.AnnotationFence},
		"receipts stripped":  {write: annotate(fence.AnnotationReceipts, "", true), want: fence.FenceRequired, names: fence.AnnotationReceipts},
		"resource elsewhere": {write: annotate(fence.AnnotationResource, "other", false), want: fence.ProtectionRemoved, names: "must carry the annotation"},
		"resource dropped":   {write: annotate(fence.AnnotationResource, "", true), want: fence.ProtectionRemoved, names: "must carry the annotation"},
		"label dropped": {write: func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"app": "web"}) },
			want: fence.ProtectionRemoved, names: "must carry the label"},
		// Never protected by its marks yet: adding them needs a fenced write.
		"marks added": {old: annotate(fence.AnnotationResource, "", true), write: annotate(fence.AnnotationResource, "web", false),
			want: fence.FenceRequired, names: fence.AnnotationResource},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			oldObj := stored()
			if c.old != nil {
				c.old(oldObj)
			}
			newObj := oldObj.DeepCopy()
			c.write(newObj)
			st := fence.State{HighestFence: 3}
			d := decideStatus(oldObj, newObj, fr, st)
			if d.Verdict != c.want || !strings.HasPrefix(d.Message, string(c.want)+":") || !strings.Contains(d.Message, c.names) {
				t.Fatalf("decideStatus = %s %q, want %s naming %q", d.Verdict, d.Message, c.want, c.names)
			}
			if d.State.HighestFence != 3 {
				t.Fatalf("the decision changed the stored state: %+v", d.State)
			}
		})
	}
}
