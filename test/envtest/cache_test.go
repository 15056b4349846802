package envtest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
)

// The operator's cache keeps of a tenant's objects only what the operator
// reads: 300 LockGrants carrying 200 KiB annotations each once grew a replica
// by 170 MiB, and a few thousand would crash-loop every replica, after which
// the fail-closed webhooks refuse every write in enrolled namespaces.
var _ = Describe("hostile input: the operator's cache holds what the operator reads", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		newFencedResource(ns, "batch", 3600)
	})

	It("keeps only what the operator reads of LockGrants, FencedResources and Namespaces in the operator's cache", func() {
		// Not overdue during this spec (a worker clock ahead counts from now):
		// the condition is left to the unreadable value below.
		record := recordJSON(func(r map[string]any) { r["since"] = primary.clock.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano) })
		largest := newGrant(ns, "batch", "worker-a", "largest")
		largest.Finalizers = []string{locksv1.GrantFinalizer} // as earlier client versions created them
		largest.Labels = map[string]string{"team": "billing"}
		largest.Annotations = map[string]string{locksv1.AnnotationUnresolvedMutation: record}
		largest.Annotations = fillMetadata(largest, locksv1.MaxLockGrantMetadataBytes)
		Expect(workers["worker-a"].Create(suiteCtx, largest)).To(Succeed())

		// Planted over the budget through break-glass: a 200 KiB annotation and a 10 KiB record.
		planted := request(ns, "batch", "worker-b", "planted")
		oversized := recordJSON(func(r map[string]any) { r["object"] = "ConfigMap/" + strings.Repeat("x", 10<<10) })
		Expect(update(admin, &locksv1.LockGrant{ObjectMeta: objectMeta(ns, planted.Name)}, func(g *locksv1.LockGrant) {
			metav1.SetMetaDataAnnotation(&g.ObjectMeta, blobAnnotation, strings.Repeat("x", 200<<10))
			metav1.SetMetaDataAnnotation(&g.ObjectMeta, locksv1.AnnotationUnresolvedMutation, oversized)
		})).To(Succeed())
		Expect(update(admin, &locksv1.FencedResource{ObjectMeta: objectMeta(ns, "batch")}, func(fr *locksv1.FencedResource) {
			metav1.SetMetaDataAnnotation(&fr.ObjectMeta, blobAnnotation, strings.Repeat("x", 200<<10))
			metav1.SetMetaDataLabel(&fr.ObjectMeta, "team", "billing")
			fr.Finalizers = append(fr.Finalizers, "example.com/hold")
		})).To(Succeed())
		DeferCleanup(func() {
			Expect(update(admin, &locksv1.FencedResource{ObjectMeta: objectMeta(ns, "batch")}, func(fr *locksv1.FencedResource) { fr.Finalizers = nil })).To(Succeed())
		})

		cached := func(obj client.Object, name string) func(Gomega) {
			return func(g Gomega) {
				g.Expect(primary.cached.Get(suiteCtx, client.ObjectKey{Namespace: obj.GetNamespace(), Name: name}, obj)).To(Succeed())
			}
		}
		var lg locksv1.LockGrant
		lg.Namespace = ns
		Eventually(func(g Gomega) {
			cached(&lg, largest.Name)(g)
			g.Expect(lg.Annotations).To(HaveKey(locksv1.AnnotationUnresolvedMutation))
		}).Should(Succeed())
		Expect(lg.Annotations).To(Equal(map[string]string{locksv1.AnnotationUnresolvedMutation: record}), "annotations beyond the record")
		Expect(lg.Labels).To(BeEmpty())
		Expect(lg.ManagedFields).To(BeEmpty())
		Expect(lg.Finalizers).To(Equal([]string{locksv1.GrantFinalizer}), "finalizers are kept: the operator removes the legacy release finalizer")

		Eventually(func(g Gomega) {
			cached(&lg, planted.Name)(g)
			g.Expect(lg.Annotations).To(HaveKey(locksv1.AnnotationUnresolvedMutation))
		}).Should(Succeed())
		Expect(lg.Annotations).To(HaveLen(1))
		Expect(lg.Annotations[locksv1.AnnotationUnresolvedMutation]).To(And(WithTransform(func(s string) int { return len(s) }, BeNumerically("<", 200)), ContainSubstring("4096")),
			"an oversized record is kept as a marker of its size")
		Expect(lg.ManagedFields).To(BeEmpty())

		fr := locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: ns}}
		Eventually(func(g Gomega) {
			cached(&fr, "batch")(g)
			g.Expect(fr.ResourceVersion).To(Equal(getFR(ns, "batch").ResourceVersion))
		}).Should(Succeed())
		Expect(fr.Annotations).To(BeEmpty())
		Expect(fr.Finalizers).To(BeEmpty())
		Expect(fr.Labels).To(BeEmpty())
		Expect(fr.ManagedFields).To(BeEmpty())

		var nsObj corev1.Namespace
		Eventually(func(g Gomega) {
			g.Expect(primary.cached.Get(suiteCtx, client.ObjectKey{Name: ns}, &nsObj)).To(Succeed())
			g.Expect(nsObj.Labels).To(HaveKey(locksv1.LabelEnrolledNamespace))
		}).Should(Succeed())
		Expect(nsObj.Labels).To(Equal(map[string]string{locksv1.LabelEnrolledNamespace: "true"}))
		Expect(nsObj.Annotations).To(BeEmpty())

		// The reconciliation controller reads the marker and says why it ignores the record.
		Eventually(reconciliationOf(ns), 10*time.Second, 50*time.Millisecond).Should(And(
			HaveField("Reason", locksv1.ReasonUnreadableMutationRecord),
			HaveField("Message", And(ContainSubstring(planted.Name), ContainSubstring("record over 4096 bytes")))))
	})

	It("measures the cache's heap for 300 LockGrants carrying the largest metadata admission allows", func() {
		const n, resources = 300, 4
		for i := range resources {
			newFencedResource(ns, fmt.Sprintf("r%d", i), 3600)
		}
		for i := range n {
			lg := newGrant(ns, fmt.Sprintf("r%d", i%resources), "worker-a", fmt.Sprintf("m-%03d", i))
			lg.Annotations = fillMetadata(lg, locksv1.MaxLockGrantMetadataBytes)
			Expect(workers["worker-a"].Create(suiteCtx, lg)).To(Succeed())
		}
		bounded := controllers.CacheOptions(opNamespace, nil)
		unbounded := controllers.CacheOptions(opNamespace, nil)
		for obj, by := range unbounded.ByObject {
			if _, ok := obj.(*locksv1.LockGrant); ok {
				by.Transform = nil // the default: managedFields stripped, nothing else
				unbounded.ByObject[obj] = by
			}
		}
		heap := func(o cache.Options) int64 {
			o.Scheme, o.DefaultNamespaces = scheme, map[string]cache.Config{ns: {}}
			before := liveHeap()
			c, err := cache.New(opCfg, o)
			Expect(err).NotTo(HaveOccurred())
			ctx, cancel := context.WithCancel(suiteCtx)
			defer cancel()
			go func() { _ = c.Start(ctx) }()
			Expect(c.WaitForCacheSync(ctx)).To(BeTrue())
			var list locksv1.LockGrantList
			Expect(c.List(ctx, &list)).To(Succeed()) // starts the informer and waits for its sync
			Expect(list.Items).To(HaveLen(n))
			list.Items = nil
			after := liveHeap()
			runtime.KeepAlive(c)
			return after - before
		}
		without, with := heap(unbounded), heap(bounded)
		line := fmt.Sprintf("cache heap for %d LockGrants with %d bytes of metadata each: %.1f MiB (%.1f KiB each) without the transform, %.1f MiB (%.1f KiB each) with it",
			n, locksv1.MaxLockGrantMetadataBytes, mib(without), kib(without)/n, mib(with), kib(with)/n)
		AddReportEntry("cache heap", line)
		_, _ = fmt.Fprintln(GinkgoWriter, line)
		Expect(with).To(BeNumerically("<", without/2), line)
	})
})

// liveHeap is the heap in use after a full collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
func kib(b int64) float64 { return float64(b) / (1 << 10) }
