package webhooks

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// The source follows the bundle: a key added later is trusted without a
// restart, a retired key no longer authenticates grants but still vouches
// for stored state, and a broken bundle keeps the last good one.
func TestTrustBundleSourceFollowsRotation(t *testing.T) {
	ctx := context.Background()
	a, _ := grant.GenerateSigner(rand.Reader)
	b, _ := grant.GenerateSigner(rand.Reader)
	key := types.NamespacedName{Namespace: "ns", Name: locksv1.TrustBundleConfigMap}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Data: grant.NewTrustBundle(0, a).Data()}
	c := fake.NewClientBuilder().WithObjects(cm).Build()
	src := &TrustBundleSource{Reader: c, Key: key}
	set := func(mutate func(*corev1.ConfigMap)) {
		t.Helper()
		if err := c.Get(ctx, key, cm); err != nil {
			t.Fatal(err)
		}
		mutate(cm)
		if err := c.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	keys := func() (string, string) {
		t.Helper()
		cur, stored, err := src.GetWithRetired(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return join(cur.KeyIDs()), join(stored.KeyIDs())
	}
	if cur, _ := keys(); cur != a.KeyID() {
		t.Fatalf("first load trusts %s", cur)
	}
	set(func(cm *corev1.ConfigMap) { cm.Data[b.KeyID()] = base64.StdEncoding.EncodeToString(b.PublicKey()) })
	if cur, _ := keys(); cur != join(grant.NewTrustBundle(0, a, b).KeyIDs()) {
		t.Fatalf("after adding a key the source trusts %s", cur)
	}
	set(func(cm *corev1.ConfigMap) {
		delete(cm.Data, a.KeyID())
		cm.Annotations = map[string]string{locksv1.AnnotationRetiredKeys: `{"` + a.KeyID() + `":"` + base64.StdEncoding.EncodeToString(a.PublicKey()) + `"}`}
	})
	cur, stored := keys()
	if cur != b.KeyID() || stored != join(grant.NewTrustBundle(0, a, b).KeyIDs()) {
		t.Fatalf("after retiring: grants %s, stored state %s", cur, stored)
	}
	set(func(cm *corev1.ConfigMap) { cm.Data["not a key"] = "x" })
	if cur, _ := keys(); cur != b.KeyID() {
		t.Fatalf("a broken bundle changed trust to %s", cur)
	}
}

func join(ids []string) string {
	out := ""
	for i, id := range ids {
		if i > 0 {
			out += ","
		}
		out += id
	}
	return out
}
