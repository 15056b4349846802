package demo_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// devCluster drives a running make dev through the kubeconfigs it wrote.
type devCluster struct {
	t     *testing.T
	ctx   context.Context
	dir   string
	admin client.Client
	// held is worker-a's lock on the Widget, kept while its namespace is deleted.
	held *lockclient.Lock
}

const widgetNS = "widgets"

func restConfig(t *testing.T, kubeconfig string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func clientFor(t *testing.T, kubeconfig string) client.Client {
	t.Helper()
	c, err := client.New(restConfig(t, kubeconfig), client.Options{Scheme: locksv1.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func widget(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("example.com/v1")
	u.SetKind("Widget")
	u.SetNamespace(widgetNS)
	u.SetName(name)
	return u
}

// protectWidget protects a Widget with an Enforce entry: worker-a's fenced
// write under its held grant is accepted, worker-b's unfenced one refused.
func (d *devCluster) protectWidget() {
	t := d.t
	if err := d.admin.Create(d.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: widgetNS}}); err != nil {
		t.Fatal(err)
	}
	fr := &locksv1.FencedResource{
		ObjectMeta: metav1.ObjectMeta{Namespace: widgetNS, Name: "w1"},
		Spec: locksv1.FencedResourceSpec{ResourceID: "widgets/w1", LeaseDurationSeconds: 30, Enforcement: locksv1.EnforcementEnforce,
			Target: &locksv1.ObjectTarget{APIVersion: "example.com/v1", Kind: "Widget", Name: "w1"}},
	}
	// The FencedResource webhook refuses a kind the API server does not
	// serve yet; the CRD was just established.
	waitFor(t, 30*time.Second, "the FencedResource for Widget w1 is admitted", func() error { return d.admin.Create(d.ctx, fr.DeepCopy()) })

	a, err := lockclient.NewForConfig(d.ctx, restConfig(t, filepath.Join(d.dir, "worker-a.kubeconfig")), widgetNS)
	if err != nil {
		t.Fatal(err)
	}
	if d.held, err = a.Acquire(d.ctx, "w1", lockclient.AcquireOptions{}); err != nil {
		t.Fatalf("worker-a acquire w1: %v", err)
	}
	w := widget("w1")
	if _, err := d.held.Operation("build-w1").Commit(d.ctx, w, func() error {
		return unstructured.SetNestedField(w.Object, "by worker-a", "spec", "result")
	}); err != nil {
		t.Fatalf("worker-a's fenced write of Widget w1 (fence %d) was refused: %v", d.held.Fence(), err)
	}

	b := clientFor(t, filepath.Join(d.dir, "worker-b.kubeconfig"))
	got := widget("w1")
	if err := b.Get(d.ctx, client.ObjectKeyFromObject(got), got); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(got.Object, "by worker-b", "spec", "result"); err != nil {
		t.Fatal(err)
	}
	err = b.Update(d.ctx, got)
	if denial, ok := lockclient.AsDenial(err); !ok || denial.Verdict != fence.FenceRequired {
		t.Fatalf("worker-b's unfenced write of the protected Widget: want %s, got %v", fence.FenceRequired, err)
	}
	if err := d.admin.Get(d.ctx, client.ObjectKeyFromObject(got), got); err != nil {
		t.Fatal(err)
	}
	if r, _, _ := unstructured.NestedString(got.Object, "spec", "result"); r != "by worker-a" {
		t.Fatalf("the Widget holds %q after the refused write, want worker-a's", r)
	}
	t.Logf("Widget w1 protected: worker-a's write at fence %d accepted, worker-b's unfenced write refused with %s", d.held.Fence(), fence.FenceRequired)
}

// namespacesDelete deletes the namespace holding the enforced Widget, its
// entry and worker-a's held grant, and an unrelated one: kube-controller-
// manager's namespace controller empties and removes both.
func (d *devCluster) namespacesDelete() {
	t := d.t
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "unrelated", Name: "settings"}, Data: map[string]string{"a": "b"}}
	if err := d.admin.Create(d.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other.Namespace}}); err != nil {
		t.Fatal(err)
	}
	if err := d.admin.Create(d.ctx, other); err != nil {
		t.Fatal(err)
	}
	defer d.held.Orphan()
	for _, name := range []string{widgetNS, other.Namespace} {
		start := time.Now()
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := d.admin.Delete(d.ctx, ns); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "namespace "+name+" is deleted", func() error {
			err := d.admin.Get(d.ctx, client.ObjectKeyFromObject(ns), ns)
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			return fmt.Errorf("still %s: %+v", ns.Status.Phase, ns.Status.Conditions)
		})
		t.Logf("namespace %s deleted in %s", name, time.Since(start).Round(time.Millisecond))
	}
}

// garbageCollected deletes an owner: the garbage collector deletes its dependent.
func (d *devCluster) garbageCollected() {
	t := d.t
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "owner"}}
	if err := d.admin.Create(d.ctx, owner); err != nil {
		t.Fatal(err)
	}
	dependent := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "dependent",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}}}}
	if err := d.admin.Create(d.ctx, dependent); err != nil {
		t.Fatal(err)
	}
	if err := d.admin.Delete(d.ctx, owner); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, 30*time.Second, "the garbage collector deletes the owner's dependent", func() error {
		err := d.admin.Get(d.ctx, client.ObjectKeyFromObject(dependent), &corev1.ConfigMap{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("ConfigMap %s/%s still exists", dependent.Namespace, dependent.Name)
	})
	t.Logf("dependent collected in %s", time.Since(start).Round(time.Millisecond))
}

// waitFor retries f every 200 ms until it succeeds, failing the test after d
// with its last error.
func waitFor(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
