package envtest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/pgserver"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// The operator publishes the registry to the PostgreSQL stores a
// FencedResource names; a store that is down delays only its own
// publication, and publication catches up once it is back.
var _ = Describe("publishing grants to a PostgreSQL store", Ordered, func() {
	const db = "stores"
	var srv *pgserver.Server

	BeforeAll(func() {
		var err error
		srv, err = pgserver.Start(suiteCtx, pgserver.Options{Fast: true})
		Expect(err).NotTo(HaveOccurred())
		Expect(srv.CreateDatabase(suiteCtx, db)).To(Succeed())
		Expect(srv.Exec(suiteCtx, db, "CREATE ROLE fk_operator LOGIN; CREATE ROLE fk_worker LOGIN")).To(Succeed())
		conn, err := pgx.Connect(suiteCtx, srv.DSN(db))
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = conn.Close(suiteCtx) }()
		Expect(pgfence.Install(suiteCtx, conn, pgfence.InstallOptions{OperatorRole: "fk_operator", WorkerRoles: []string{"fk_worker"}})).To(Succeed())
	})
	AfterAll(func() {
		if srv != nil {
			Expect(srv.Stop()).To(Succeed())
		}
	})

	// published asks the store, as the workers' role, whether the grant is
	// published and not ended ("" when the store cannot be asked).
	published := func(digest string) func() string {
		return func() string {
			ctx, cancel := context.WithTimeout(suiteCtx, 2*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, srv.DSN(db)+" user=fk_worker")
			if err != nil {
				return ""
			}
			defer func() { _ = conn.Close(ctx) }()
			ok, err := pgfence.Published(ctx, conn, digest)
			if err != nil {
				return ""
			}
			if ok {
				return "published"
			}
			return "not published"
		}
	}
	storeReason := func(ns, name string) func() string {
		return func() string {
			fr := getFR(ns, name)
			if len(fr.Status.Stores) == 0 {
				return ""
			}
			return fr.Status.Stores[0].Reason
		}
	}

	It("publishes the holder and ends the previous one, catching up after the store was down", func() {
		ns := newNamespace()
		Expect(admin.Create(suiteCtx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ledger-db"},
			StringData: map[string]string{"dsn": srv.DSN(db) + " user=fk_operator"}})).To(Succeed())
		newFencedResource(ns, "ledger", 600, func(fr *locksv1.FencedResource) {
			fr.Spec.Stores = []locksv1.StoreReference{{Name: "ledger-db", SecretRef: locksv1.StoreSecretReference{Name: "ledger-db"}}}
		})
		a := waitPhase(request(ns, "ledger", "worker-a", "job-1"), locksv1.PhaseHeld)
		digestA := getFR(ns, "ledger").Status.Holder.Digest
		Eventually(published(digestA)).Should(Equal("published"))
		Eventually(storeReason(ns, "ledger")).Should(Equal(locksv1.ReasonStorePublished))
		c := meta.FindStatusCondition(getFR(ns, "ledger").Status.Conditions, locksv1.ConditionStoresPublished)
		Expect(c).NotTo(BeNil())
		Expect(c.Status).To(Equal(metav1.ConditionTrue))

		By("the store goes down: the handoff is not delayed, the failure is reported once")
		Expect(srv.Shutdown()).To(Succeed())
		queued := request(ns, "ledger", "worker-b", "job-2")
		release(a)
		waitPhase(queued, locksv1.PhaseHeld)
		digestB := getFR(ns, "ledger").Status.Holder.Digest
		Eventually(storeReason(ns, "ledger")).Should(Equal(locksv1.ReasonStoreUnreachable))
		Eventually(func() []string { return eventReasons(ns, "ledger") }).Should(ContainElement(locksv1.EventReasonStorePublishFailed))
		By("a resource without stores issues meanwhile")
		newFencedResource(ns, "other", 600)
		waitPhase(request(ns, "other", "worker-c", "job-3"), locksv1.PhaseHeld)

		By("the store is back: the new holder is published, the old one ended")
		Expect(srv.Restart(suiteCtx)).To(Succeed())
		Eventually(published(digestB), 45*time.Second, 250*time.Millisecond).Should(Equal("published"))
		Expect(published(digestA)()).To(Equal("not published"))
		Eventually(storeReason(ns, "ledger")).Should(Equal(locksv1.ReasonStorePublished))
		Eventually(func() []string { return eventReasons(ns, "ledger") }).Should(ContainElement(locksv1.EventReasonStoreRecovered))
	})

	It("refuses a malformed stores entry at admission", func() {
		ns := newNamespace()
		for _, s := range []locksv1.StoreReference{
			{Name: "Bad_Name", SecretRef: locksv1.StoreSecretReference{Name: "db"}},
			{Name: "db", SecretRef: locksv1.StoreSecretReference{Name: "not a name"}},
		} {
			fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad"},
				Spec: locksv1.FencedResourceSpec{ResourceID: "test/bad", LeaseDurationSeconds: 10, Stores: []locksv1.StoreReference{s}}}
			err := admin.Create(suiteCtx, fr)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring("spec.stores"))
		}
	})
})
