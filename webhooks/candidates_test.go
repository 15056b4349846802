package webhooks

import (
	"context"
	"errors"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := locksv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// noLists is the API server reader of the test: a LIST of the namespace's
// entries is what a create the index misses must not cost.
type noLists struct{ client.Reader }

func (noLists) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("listed the namespace's FencedResources")
}

// A create of an object the lagging index does not know finds its entry
// through the target claim (one GET), so a stranger cannot create a new
// entry's target unfenced; with no claim the object is nobody's target.
func TestCreateTheIndexMissesReadsTheTargetClaim(t *testing.T) {
	ctx := context.Background()
	const operatorNS = "fencekeeper-system"
	key := locksv1.TargetKey("", "ConfigMap", "cfg")
	entry := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "batch"},
		Spec: locksv1.FencedResourceSpec{ResourceID: "r", Target: &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: "cfg"}}}
	claim := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: locksv1.TargetClaimName("billing", key)},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("billing/batch")}}
	server := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(entry, claim).Build()
	laggingIndex := fake.NewClientBuilder().WithScheme(testScheme(t)).WithIndex(&locksv1.FencedResource{}, locksv1.FencedResourceTargetField,
		func(client.Object) []string { return nil }).Build()
	v := &ProtectedObjectValidator{Reader: noLists{server}, Index: laggingIndex, Namespace: operatorNS}
	create := func(ns, name string) *request {
		return &request{Request: admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Create, Namespace: ns}},
			kind: "ConfigMap", name: name}
	}

	fr, err := v.entry(ctx, create("billing", "cfg"))
	if err != nil || fr == nil || fr.Name != "batch" {
		t.Fatalf("the claimed target: entry %v, err %v", fr, err)
	}
	if fr, err := v.entry(ctx, create("billing", "other")); err != nil || fr != nil {
		t.Fatalf("an unclaimed object: entry %v, err %v", fr, err)
	}
	// The claim of a name in another namespace is another object's.
	if fr, err := v.entry(ctx, create("payments", "cfg")); err != nil || fr != nil {
		t.Fatalf("another namespace's object of the same name: entry %v, err %v", fr, err)
	}
	// A claim whose entry is gone (or never landed) protects nothing.
	if err := server.Delete(ctx, entry); err != nil {
		t.Fatal(err)
	}
	if fr, err := v.entry(ctx, create("billing", "cfg")); err != nil || fr != nil {
		t.Fatalf("a claim whose entry is gone: entry %v, err %v", fr, err)
	}
}
