package lockclient_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// cfg is the worker's connection to the API server; in a real worker it is
// ctrl.GetConfigOrDie() or rest.InClusterConfig(). TestMain points it at the
// control plane test/examples started (with the operator running).
var cfg *rest.Config

// Example claims a FencedResource, writes its protected ConfigMap in two
// fenced segments of one operation, and releases the claim.
func Example() {
	ctx := context.Background()
	c, err := lockclient.NewForConfig(ctx, cfg, "billing")
	if err != nil {
		panic(err)
	}
	lock, err := c.Acquire(ctx, "invoice-batch", lockclient.AcquireOptions{RequestID: "nightly-2026-07-19"})
	if err != nil {
		panic(err)
	}
	defer lock.Orphan()
	fmt.Println("held with fence", lock.Fence())

	op := lock.Operation("settle-2026-07-19")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "invoice-batch"}}
	for _, part := range []string{"0001-0100", "0101-0200"} {
		receipt, err := op.Commit(ctx, cm, func() error {
			if cm.Data == nil {
				cm.Data = map[string]string{}
			}
			cm.Data[part] = "settled"
			return nil
		})
		if err != nil {
			panic(err) // errors.Is(err, lockclient.ErrStaleOwner), ErrOwnershipUnknown, …
		}
		fmt.Printf("segment %d accepted under fence %d\n", receipt.Segment, receipt.Fence)
	}
	if err := lock.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println(lock.State())
	// Output:
	// held with fence 1
	// segment 1 accepted under fence 1
	// segment 2 accepted under fence 1
	// RELEASED
}

// ExampleClient_Attach resumes after a crash: the restarted worker finds its
// held grant by name, and the operation continues from the receipt log.
func ExampleClient_Attach() {
	ctx := context.Background()
	c, _ := lockclient.NewForConfig(ctx, cfg, "billing")
	first, err := c.Acquire(ctx, "report", lockclient.AcquireOptions{RequestID: "report-42"})
	if err != nil {
		panic(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "report"}}
	setPage := func(page string) func() error {
		return func() error { cm.Data = map[string]string{"page": page}; return nil }
	}
	if _, err := first.Operation("render-report-42").Commit(ctx, cm, setPage("1")); err != nil {
		panic(err)
	}
	first.Orphan() // the worker crashes here; its grant is still held

	restarted, _ := lockclient.NewForConfig(ctx, cfg, "billing")
	lock, err := restarted.Attach(ctx, restarted.LockGrantName("report", "report-42"), lockclient.AcquireOptions{})
	if err != nil {
		panic(err)
	}
	defer lock.Orphan()
	receipt, err := lock.Operation("render-report-42").Commit(ctx, cm, setPage("2"))
	if err != nil {
		panic(err)
	}
	fmt.Printf("fence %d resumed at segment %d\n", receipt.Fence, receipt.Segment)
	// Output:
	// fence 1 resumed at segment 2
}

// ExampleOperation_Delete retires a protected object: the holder declares the
// delete in a fenced segment of its operation, then deletes the object as
// that segment wrote it.
func ExampleOperation_Delete() {
	ctx := context.Background()
	c, _ := lockclient.NewForConfig(ctx, cfg, "billing")
	lock, err := c.Acquire(ctx, "retired", lockclient.AcquireOptions{RequestID: "retire-1"})
	if err != nil {
		panic(err)
	}
	defer lock.Orphan()
	op := lock.Operation("retire-2026-07-19")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "retired"}}
	if _, err := op.Commit(ctx, cm, func() error { cm.Data = map[string]string{"state": "done"}; return nil }); err != nil {
		panic(err)
	}
	intent, err := op.Delete(ctx, cm)
	if err != nil {
		panic(err) // errors.Is(err, lockclient.ErrChangedSinceIntent), ErrDeleteNotDeclared, ErrStaleOwner, …
	}
	fmt.Printf("delete declared in segment %d under fence %d; object deleted\n", intent.Segment, intent.Fence)
	// Output:
	// delete declared in segment 2 under fence 1; object deleted
}

// ExampleLock_Guard shows the guard after the issuer expired a lease that was
// not renewed: the lock is EXPIRED, Done is closed, and no new effect may start.
func ExampleLock_Guard() {
	ctx := context.Background()
	c, _ := lockclient.NewForConfig(ctx, cfg, "billing")
	// "short-lease" has a 1 s lease; this worker renews far too rarely.
	lock, err := c.Acquire(ctx, "short-lease", lockclient.AcquireOptions{RenewInterval: time.Hour})
	if err != nil {
		panic(err)
	}
	defer lock.Orphan()
	fmt.Println(lock.State(), lock.Guard())
	<-lock.Done()
	fmt.Println(lock.State(), errors.Is(lock.Guard(), lockclient.ErrExpired))
	// Output:
	// HELD <nil>
	// EXPIRED true
}

// examplesKubeconfig names the kubeconfig of a worker of a control plane that
// runs the operator and has the examples' namespace and FencedResources.
// test/examples sets it and runs the examples; without it, go test in this
// package runs only its pure tests (the examples still compile).
const examplesKubeconfig = "FENCEKEEPER_EXAMPLES_KUBECONFIG"

func TestMain(m *testing.M) {
	path := os.Getenv(examplesKubeconfig)
	if path == "" {
		if err := flag.Set("test.skip", "^Example"); err != nil {
			panic(err)
		}
		os.Exit(m.Run())
	}
	var err error
	if cfg, err = clientcmd.BuildConfigFromFlags("", path); err != nil {
		fmt.Fprintf(os.Stderr, "%s=%s: %v\n", examplesKubeconfig, path, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}
