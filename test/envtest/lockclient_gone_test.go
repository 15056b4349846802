package envtest

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// A held grant whose LockGrant vanishes (deleted by a break-glass admin or
// its owner; LockGrants carry no finalizer, so the issuer never writes a
// last status) is over: the issuer serves the next waiter, so the holder
// must stop too, on the API server's word that the object is gone
// (EventGone). Before the client learned that, it stayed HELD or
// OWNERSHIP_UNKNOWN for ever and Done never closed.
var _ = Describe("the worker client when its LockGrant is deleted", func() {
	It("ends EXPIRED (ErrExpired, Done closed) and the next waiter is served", func() {
		ns := newNamespace()
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		holder, _ := faultyWorker(ns, "worker-a")
		log := &stateLog{}
		ctx := suiteCtx
		l, err := holder.Acquire(ctx, "batch", lockclient.AcquireOptions{RequestID: "job-1",
			RenewInterval: 150 * time.Millisecond, RequestTimeout: 100 * time.Millisecond, OnStateChange: log.record})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(l.Orphan)
		Expect(l.State()).To(Equal(lockclient.StateHeld))

		next, _ := faultyWorker(ns, "worker-b")
		waiting := make(chan *lockclient.Lock, 1)
		go func() {
			defer GinkgoRecover()
			w, err := next.Acquire(ctx, "batch", lockclient.AcquireOptions{RequestID: "job-2", RenewInterval: 150 * time.Millisecond})
			Expect(err).NotTo(HaveOccurred())
			waiting <- w
		}()
		Eventually(func() int {
			var list locksv1.LockGrantList
			Expect(admin.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			return len(list.Items)
		}, 5*time.Second).Should(Equal(2), "worker-b queued")

		// The cluster admin deletes the holder's LockGrant (break-glass).
		held := getGrant(ns, l.Name())
		Expect(held.Finalizers).To(BeEmpty())
		Expect(admin.Delete(ctx, held)).To(Succeed())
		Eventually(func() bool {
			err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: l.Name()}, &locksv1.LockGrant{})
			return apierrors.IsNotFound(err)
		}, 10*time.Second).Should(BeTrue(), "the LockGrant is gone")

		Eventually(l.Done(), 5*time.Second).Should(BeClosed())
		Expect(l.State()).To(Equal(lockclient.StateExpired))
		Expect(l.Guard()).To(MatchError(lockclient.ErrExpired))
		Expect(log.all()).NotTo(ContainElement(lockclient.StateReleased), "nobody released it")

		var w *lockclient.Lock
		Eventually(waiting, 10*time.Second).Should(Receive(&w))
		DeferCleanup(w.Orphan)
		Expect(w.State()).To(Equal(lockclient.StateHeld))
		Expect(w.Fence()).To(Equal(int64(2)))
	})

	It("ends an Acquire whose LockGrant is deleted while it waits, EXPIRED", func() {
		// The waiter's watch delivered the deletion as nil, which the wait
		// read as a LockGrant: the worker's process panicked.
		ns := newNamespace()
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		holder, _ := faultyWorker(ns, "worker-a")
		mustAcquire(holder, "batch", "job-1")
		waiter, _ := faultyWorker(ns, "worker-b")
		result := make(chan error, 1)
		go func() {
			defer GinkgoRecover()
			_, err := waiter.Acquire(suiteCtx, "batch", lockclient.AcquireOptions{RequestID: "job-2"})
			result <- err
		}()
		name := locksv1.LockGrantName("batch", "worker-b", "job-2")
		Eventually(func() error {
			return admin.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, &locksv1.LockGrant{})
		},
			5*time.Second).Should(Succeed(), "worker-b queued")
		Expect(admin.Delete(suiteCtx, &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})).To(Succeed())
		var err error
		Eventually(result, 10*time.Second).Should(Receive(&err))
		Expect(err).To(MatchError(lockclient.ErrExpired))
		Expect(err.Error()).To(ContainSubstring("deleted"))
	})

	It("ends EXPIRED on the registry's record before its first renewal, with no watch of its LockGrant", func() {
		// A lock renews every minute: until then only the registry's record
		// of the grant's end (written by the compare-and-swap that ends it)
		// can tell it.
		ns := newNamespace()
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		holder, requests := countingWorker(ns, "worker-a")
		log := &stateLog{}
		l, err := holder.Acquire(suiteCtx, "batch", lockclient.AcquireOptions{RequestID: "job-1",
			RenewInterval: time.Minute, OnStateChange: log.record})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(l.Orphan)
		Expect(admin.Delete(suiteCtx, getGrant(ns, l.Name()))).To(Succeed())
		Eventually(l.Done(), 10*time.Second).Should(BeClosed())
		Expect(l.State()).To(Equal(lockclient.StateExpired))
		Expect(l.Err()).To(MatchError(lockclient.ErrExpired))
		Expect(log.all()).NotTo(ContainElement(lockclient.StateReleased), "nobody released it")
		Expect(requests()).NotTo(HaveKey("WATCH lockgrants"))
	})
})
