package envtest

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/pgserver"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// The operator publishes the registry to the PostgreSQL stores a
// FencedResource names, and the database refuses what the registry no
// longer holds: the stale owner's segment, a grant never published, a
// revoked epoch. A store the operator cannot reach delays only its own
// publication, and publication catches up once it is back.
var _ = Describe("publishing grants to a PostgreSQL store", Ordered, func() {
	const db = "stores"
	var (
		srv      *pgserver.Server
		workerDB *pgxpool.Pool
		// operatorDB reads what the operator published (its role may).
		operatorDB *pgxpool.Pool
	)

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
		workerDB, err = pgxpool.New(suiteCtx, srv.DSN(db)+" user=fk_worker")
		Expect(err).NotTo(HaveOccurred())
		operatorDB, err = pgxpool.New(suiteCtx, srv.DSN(db)+" user=fk_operator")
		Expect(err).NotTo(HaveOccurred())
	})
	// The store judges a grant's expiry by the database's clock, the real
	// one; the issuer's is the suite's fake clock, which stands still between
	// steps. Each spec starts with it caught up: in a suite that has run a
	// while, a grant issued from a clock more than a lease behind is one the
	// store already finds expired (NOT_HELD).
	BeforeEach(func() {
		if lag := time.Since(primary.clock.Now()); lag > 0 {
			primary.step(lag)
		}
	})
	AfterAll(func() {
		for _, p := range []*pgxpool.Pool{workerDB, operatorDB} {
			if p != nil {
				p.Close()
			}
		}
		if srv != nil {
			Expect(srv.Stop()).To(Succeed())
		}
	})

	// protectedTable makes a business table that only segments of resourceID may change.
	protectedTable := func(table, resourceID string) {
		GinkgoHelper()
		Expect(srv.Exec(suiteCtx, db, fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY, amount text NOT NULL); GRANT SELECT, INSERT, UPDATE ON %s TO fk_worker", table, table))).To(Succeed())
		conn, err := pgx.Connect(suiteCtx, srv.DSN(db))
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = conn.Close(suiteCtx) }()
		Expect(pgfence.Protect(suiteCtx, conn, table, resourceID)).To(Succeed())
	}
	// storeResource makes a Secret with the operator role's DSN and an
	// enforced FencedResource naming it as its store.
	storeResource := func(ns, name string, lease int32) {
		GinkgoHelper()
		Expect(admin.Create(suiteCtx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-db"},
			StringData: map[string]string{"dsn": srv.DSN(db) + " user=fk_operator"}})).To(Succeed())
		newFencedResource(ns, name, lease, func(fr *locksv1.FencedResource) {
			fr.Spec.Enforcement = locksv1.EnforcementEnforce
			fr.Spec.Stores = []locksv1.StoreReference{{Name: name + "-db", SecretRef: locksv1.StoreSecretReference{Name: name + "-db"}}}
		})
	}
	setDSN := func(ns, secret, dsn string) {
		GinkgoHelper()
		Expect(update(admin, &corev1.Secret{ObjectMeta: objectMeta(ns, secret)}, func(s *corev1.Secret) {
			s.Data = map[string][]byte{"dsn": []byte(dsn)}
		})).To(Succeed())
	}
	// published asks the store, as the workers' role, whether the grant is
	// published and not ended ("" when the store cannot be asked).
	published := func(digest string) func() string {
		return func() string {
			ctx, cancel := context.WithTimeout(suiteCtx, 2*time.Second)
			defer cancel()
			ok, err := pgfence.Published(ctx, workerDB, digest)
			switch {
			case err != nil:
				return ""
			case ok:
				return "published"
			}
			return "not published"
		}
	}
	// commit runs one segment of g (as the workers' role) that sets row 1
	// of table to amount, and returns the refusal's verdict ("" when it
	// committed; the error's text when it failed otherwise).
	commit := func(g grant.Grant, proof, table string, segment int64, amount string) string {
		GinkgoHelper()
		payload, err := fence.PayloadDigest(map[string]any{"table": table, "id": 1, "amount": amount})
		Expect(err).NotTo(HaveOccurred())
		env := fence.Envelope{Grant: g, Proof: proof, Operation: "op-" + g.Owner, Segment: segment, Payload: payload}
		ctx, cancel := context.WithTimeout(suiteCtx, 5*time.Second)
		defer cancel()
		_, err = pgfence.Commit(ctx, workerDB, env, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (id, amount) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET amount = excluded.amount", table), amount)
			return err
		})
		if err == nil {
			return ""
		}
		if re, ok := pgfence.AsRefusal(err); ok {
			return string(re.Verdict)
		}
		return err.Error()
	}
	amount := func(table string) string {
		GinkgoHelper()
		var a string
		Expect(workerDB.QueryRow(suiteCtx, fmt.Sprintf("SELECT amount FROM %s WHERE id = 1", table)).Scan(&a)).To(Succeed())
		return a
	}
	worker := func(ns, user string) *lockclient.Client {
		GinkgoHelper()
		c, err := lockclient.NewForConfig(suiteCtx, testEnvUserConfig(user), ns)
		Expect(err).NotTo(HaveOccurred())
		return c
	}
	condition := func(ns, name string) func() string {
		return func() string {
			c := meta.FindStatusCondition(getFR(ns, name).Status.Conditions, locksv1.ConditionStoresPublished)
			if c == nil {
				return ""
			}
			return string(c.Status) + "/" + c.Reason
		}
	}
	count := func(ns, name, reason string) func() int {
		return func() int {
			n := 0
			for _, r := range eventReasons(ns, name) {
				if r == reason {
					n++
				}
			}
			return n
		}
	}
	// handOff orphans a (its worker stalls: no renewals, no release), lets its
	// lease run out on the issuer's clock and returns b's lock, acquired next.
	handOff := func(ns, resource string, a *lockclient.Lock, cb *lockclient.Client, requestID string) *lockclient.Lock {
		GinkgoHelper()
		a.Orphan()
		got := make(chan *lockclient.Lock, 1)
		go func() {
			defer GinkgoRecover()
			got <- mustAcquire(cb, resource, requestID)
		}()
		Eventually(func() int { return len(getFR(ns, resource).Status.Queue) }).Should(Equal(1))
		primary.step(11 * time.Second)
		var b *lockclient.Lock
		Eventually(got, 10*time.Second).Should(Receive(&b))
		return b
	}

	It("refuses the stale owner's segment in the database: STALE_OWNER, B's row intact", func() {
		ns := newNamespace()
		storeResource(ns, "invoices", 10)
		protectedTable("invoices", getFR(ns, "invoices").Spec.ResourceID)
		a := mustAcquire(worker(ns, "worker-a"), "invoices", "a")
		gA, proofA := a.Grant()
		Eventually(published(gA.Digest())).Should(Equal("published"))
		Expect(commit(gA, proofA, "invoices", 1, "A 1")).To(BeEmpty())
		fr := getFR(ns, "invoices")
		Expect(fr.Status.Stores).To(HaveLen(1))
		Expect(fr.Status.Stores[0].PublishedFence).To(Equal(int64(1)))
		Expect(fr.Status.Stores[0].PublishedDigest).To(Equal(gA.Digest()))
		Expect(condition(ns, "invoices")()).To(Equal("True/" + locksv1.ReasonStorePublished))

		By("A stalls, its lease runs out, B takes fence 2 and commits")
		b := handOff(ns, "invoices", a, worker(ns, "worker-b"), "b")
		gB, proofB := b.Grant()
		Expect(gB.FenceToken).To(Equal(int64(2)))
		Eventually(published(gB.Digest())).Should(Equal("published"))
		Eventually(published(gA.Digest())).Should(Equal("not published"), "A's grant is ended at the store")
		Expect(commit(gB, proofB, "invoices", 1, "B")).To(BeEmpty())

		By("A wakes up and commits its next segment under fence 1: the database refuses it")
		Expect(commit(gA, proofA, "invoices", 2, "A 2")).To(Equal(string(fence.StaleOwner)))
		Expect(amount("invoices")).To(Equal("B"))
		var reason string
		Expect(operatorDB.QueryRow(suiteCtx, "SELECT end_reason FROM fencekeeper.grants WHERE digest = $1", gA.Digest()).Scan(&reason)).To(Succeed())
		Expect(reason).To(Equal(locksv1.ReasonExpired), "ended with the registry's reason")
	})

	It("catches up after the operator could not reach the store; nothing stale is accepted meanwhile", func() {
		ns := newNamespace()
		storeResource(ns, "payments", 10)
		protectedTable("payments", getFR(ns, "payments").Spec.ResourceID)
		a := mustAcquire(worker(ns, "worker-a"), "payments", "a")
		gA, proofA := a.Grant()
		Eventually(published(gA.Digest())).Should(Equal("published"))
		Expect(commit(gA, proofA, "payments", 1, "A 1")).To(BeEmpty())
		b := handOff(ns, "payments", a, worker(ns, "worker-b"), "b")
		gB, proofB := b.Grant()
		Eventually(published(gA.Digest())).Should(Equal("not published"))
		Eventually(published(gB.Digest())).Should(Equal("published"))
		Expect(commit(gB, proofB, "payments", 1, "B")).To(BeEmpty())

		By("the operator's DSN points nowhere: B hands over to C, unpublished, and the failure is reported once")
		setDSN(ns, "payments-db", srv.DSN(db)+" user=fk_operator port=1")
		got := make(chan *lockclient.Lock, 1)
		go func() {
			defer GinkgoRecover()
			got <- mustAcquire(worker(ns, "worker-c"), "payments", "c")
		}()
		Eventually(func() int { return len(getFR(ns, "payments").Status.Queue) }).Should(Equal(1))
		Expect(b.Release(suiteCtx)).To(Succeed())
		var c *lockclient.Lock
		Eventually(got, 5*time.Second).Should(Receive(&c), "the handoff does not wait for the store")
		gC, proofC := c.Grant()
		Eventually(condition(ns, "payments")).Should(Equal("False/" + locksv1.ReasonStoreUnreachable))
		Eventually(count(ns, "payments", locksv1.EventReasonStorePublishFailed)).Should(Equal(1))

		By("a resource without stores issues meanwhile, at once")
		newFencedResource(ns, "other", 600)
		start := time.Now()
		waitPhase(request(ns, "other", "worker-d", "d"), locksv1.PhaseHeld)
		Expect(time.Since(start)).To(BeNumerically("<", 3*time.Second))

		By("meanwhile the database accepts neither A (stale) nor C (not published)")
		Consistently(func() []string {
			return []string{commit(gA, proofA, "payments", 2, "A 2"), commit(gC, proofC, "payments", 1, "C early")}
		}, 3*time.Second, 500*time.Millisecond).Should(Equal([]string{string(fence.StaleOwner), string(fence.ForgedGrant)}))
		Expect(count(ns, "payments", locksv1.EventReasonStorePublishFailed)()).To(Equal(1), "one Warning per outage, not one per retry")
		Expect(amount("payments")).To(Equal("B"))

		By("the DSN is fixed: C is published, B ended, the store recovered")
		setDSN(ns, "payments-db", srv.DSN(db)+" user=fk_operator")
		Eventually(published(gC.Digest()), 45*time.Second, 250*time.Millisecond).Should(Equal("published"))
		Eventually(published(gB.Digest())).Should(Equal("not published"))
		Eventually(condition(ns, "payments")).Should(Equal("True/" + locksv1.ReasonStorePublished))
		Eventually(count(ns, "payments", locksv1.EventReasonStoreRecovered)).Should(Equal(1))
		Expect(getFR(ns, "payments").Status.Stores[0].PublishedFence).To(Equal(gC.FenceToken))
		Expect(commit(gC, proofC, "payments", 1, "C")).To(BeEmpty())
		Expect(commit(gA, proofA, "payments", 2, "A 2")).To(Equal(string(fence.StaleOwner)))
		Expect(amount("payments")).To(Equal("C"))
	})

	It("publishes the holder and ends the previous one, catching up after the store was down", func() {
		ns := newNamespace()
		storeResource(ns, "ledger", 600)
		a := waitPhase(request(ns, "ledger", "worker-a", "job-1"), locksv1.PhaseHeld)
		digestA := getFR(ns, "ledger").Status.Holder.Digest
		Eventually(published(digestA)).Should(Equal("published"))
		Eventually(condition(ns, "ledger")).Should(Equal("True/" + locksv1.ReasonStorePublished))

		By("the store goes down: the handoff is not delayed, the failure is reported")
		Expect(srv.Shutdown()).To(Succeed())
		queued := request(ns, "ledger", "worker-b", "job-2")
		release(a)
		waitPhase(queued, locksv1.PhaseHeld)
		digestB := getFR(ns, "ledger").Status.Holder.Digest
		Eventually(condition(ns, "ledger")).Should(Equal("False/" + locksv1.ReasonStoreUnreachable))
		Eventually(count(ns, "ledger", locksv1.EventReasonStorePublishFailed)).Should(Equal(1))

		By("the store is back: the new holder is published, the old one ended")
		Expect(srv.Restart(suiteCtx)).To(Succeed())
		Eventually(published(digestB), 45*time.Second, 250*time.Millisecond).Should(Equal("published"))
		Expect(published(digestA)()).To(Equal("not published"))
		Eventually(condition(ns, "ledger")).Should(Equal("True/" + locksv1.ReasonStorePublished))
		Eventually(count(ns, "ledger", locksv1.EventReasonStoreRecovered)).Should(Equal(1))
	})

	It("does not let one namespace's hanging stores delay another namespace's publication", func() {
		// A store that accepts connections and never answers: every
		// publication to it holds a publisher worker for its whole timeout.
		tarpit, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		var held []net.Conn
		var heldMu sync.Mutex
		go func() {
			for {
				c, err := tarpit.Accept()
				if err != nil {
					return
				}
				heldMu.Lock()
				held = append(held, c)
				heldMu.Unlock()
			}
		}()
		hostile := newNamespace()
		DeferCleanup(func() {
			for i := range 8 {
				_ = admin.Delete(suiteCtx, &locksv1.FencedResource{ObjectMeta: objectMeta(hostile, fmt.Sprintf("tarpit-%d", i))})
			}
			_ = tarpit.Close()
			heldMu.Lock()
			defer heldMu.Unlock()
			for _, c := range held {
				_ = c.Close()
			}
		})
		dsn := fmt.Sprintf("host=127.0.0.1 port=%d dbname=x user=x sslmode=disable", tarpit.Addr().(*net.TCPAddr).Port)
		for i := range 8 {
			name := fmt.Sprintf("tarpit-%d", i)
			Expect(admin.Create(suiteCtx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: hostile, Name: name},
				StringData: map[string]string{"dsn": dsn}})).To(Succeed())
			newFencedResource(hostile, name, 30, func(fr *locksv1.FencedResource) {
				fr.Spec.Stores = []locksv1.StoreReference{{Name: "db", SecretRef: locksv1.StoreSecretReference{Name: name}}}
			})
		}
		Eventually(func() int {
			heldMu.Lock()
			defer heldMu.Unlock()
			return len(held)
		}).Should(BeNumerically(">=", 2), "the publisher is calling the hanging stores")

		ns := newNamespace()
		storeResource(ns, "orders", 600)
		a := mustAcquire(worker(ns, "worker-a"), "orders", "a")
		gA, _ := a.Grant()
		// One hanging call lasts 5 s; with every worker held by them this
		// grant would wait for two rounds of them.
		Eventually(published(gA.Digest()), 4*time.Second, 50*time.Millisecond).Should(Equal("published"))
	})

	It("refuses a malformed stores entry at admission, naming the field", func() {
		ns := newNamespace()
		ref := func(name, secret, key string) locksv1.StoreReference {
			return locksv1.StoreReference{Name: name, SecretRef: locksv1.StoreSecretReference{Name: secret, Key: key}}
		}
		nine := make([]locksv1.StoreReference, 0, 9)
		for i := range 9 {
			nine = append(nine, ref(fmt.Sprintf("db-%d", i), "db", ""))
		}
		for field, stores := range map[string][]locksv1.StoreReference{
			"spec.stores[0].name":           {ref("Bad_Name", "db", "")},
			"spec.stores[0].secretRef.name": {ref("db", "not a name", "")},
			"spec.stores[0].secretRef.key":  {ref("db", "db", "a/b")},
			"spec.stores[1]":                {ref("db", "one", ""), ref("db", "two", "")},
			"spec.stores":                   nine,
		} {
			fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad"},
				Spec: locksv1.FencedResourceSpec{ResourceID: "test/bad", LeaseDurationSeconds: 10, Stores: stores}}
			err := admin.Create(suiteCtx, fr)
			Expect(err).To(HaveOccurred(), field)
			Expect(err.Error()).To(ContainSubstring(field))
			AddReportEntry("refused "+field, err.Error())
		}
	})

	// Last: the store keeps revokedBelowEpoch (it only grows).
	It("publishes a raised revokedBelowEpoch: the database refuses an older epoch's grant with REVOKED_EPOCH", func() {
		ns := newNamespace()
		storeResource(ns, "refunds", 600)
		protectedTable("refunds", getFR(ns, "refunds").Spec.ResourceID)
		a := mustAcquire(worker(ns, "worker-a"), "refunds", "a")
		gA, proofA := a.Grant()
		Eventually(published(gA.Digest())).Should(Equal("published"))
		Expect(commit(gA, proofA, "refunds", 1, "A 1")).To(BeEmpty())

		setRevokedBelow(gA.IssuerEpoch + 1)
		DeferCleanup(setRevokedBelow, int64(0))
		Eventually(func() (int64, error) {
			var below int64
			err := operatorDB.QueryRow(suiteCtx, "SELECT revoked_below_epoch FROM fencekeeper.issuer").Scan(&below)
			return below, err
		}).Should(Equal(gA.IssuerEpoch + 1))
		Expect(commit(gA, proofA, "refunds", 2, "A 2")).To(Equal(string(fence.RevokedEpoch)))
		Expect(amount("refunds")).To(Equal("A 1"))
	})
})
