package envtest

import (
	"context"
	"errors"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// Replicas of one ServiceAccount share its identity. Their credentials are
// bound service-account tokens, which the API server itself ties to their
// pod (userInfo.extra authentication.kubernetes.io/pod-uid): these specs
// issue real ones with the TokenRequest API, for two pods of one
// ServiceAccount, and check that neither pod can use the other's grant.
var _ = Describe("Grants bound to the pod that asked", func() {
	var (
		ns     string
		sa     string
		podCfg map[string]*rest.Config // pod name -> its bound token's config
		podUID map[string]string
	)

	BeforeEach(func() {
		ns = newNamespace()
		sa = "system:serviceaccount:" + ns + ":worker"
		Expect(admin.Create(suiteCtx, &corev1.ServiceAccount{ObjectMeta: objectMeta(ns, "worker")})).To(Succeed())
		// The ServiceAccount gets what the workers group has, nothing more.
		for _, role := range []string{"lockgrant-requester", "protected-object-writer"} {
			Expect(admin.Create(suiteCtx, &rbacv1.RoleBinding{ObjectMeta: objectMeta(ns, "worker-"+role),
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "worker", Namespace: ns}}})).To(Succeed())
		}
		podCfg, podUID = map[string]*rest.Config{}, map[string]string{}
		core := kubernetes.NewForConfigOrDie(adminCfg)
		for _, name := range []string{"replica-a", "replica-b"} {
			pod := &corev1.Pod{ObjectMeta: objectMeta(ns, name), Spec: corev1.PodSpec{ServiceAccountName: "worker",
				AutomountServiceAccountToken: ptr.To(false), Containers: []corev1.Container{{Name: "worker", Image: "worker"}}}}
			Expect(admin.Create(suiteCtx, pod)).To(Succeed())
			tr, err := core.CoreV1().ServiceAccounts(ns).CreateToken(suiteCtx, "worker", &authenticationv1.TokenRequest{
				Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600),
					BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: name, UID: pod.UID}},
			}, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
			cfg := rest.AnonymousClientConfig(adminCfg)
			cfg.BearerToken = tr.Status.Token
			podCfg[name], podUID[name] = cfg, string(pod.UID)
		}
	})

	podClient := func(name string) client.Client {
		GinkgoHelper()
		c, err := client.New(podCfg[name], client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		return c
	}
	podLocks := func(name string) *lockclient.Client {
		GinkgoHelper()
		c, err := lockclient.NewForConfig(suiteCtx, podCfg[name], ns)
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Identity()).To(Equal(sa))
		Expect(c.Pod()).To(Equal(podUID[name]), "the API server names the token's pod")
		return c
	}

	It("binds the grant to the pod; the other replica gets WRONG_OWNER for writes, delete intents and deletes", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		lock := mustAcquire(podLocks("replica-a"), "batch", "job-1")
		lg := getGrant(ns, lock.Name())
		Expect(lg.Spec.Lease).To(Equal(grant.PodLease(podUID["replica-a"])))

		// The other replica reads the holder's grant (it may read LockGrants
		// and the object's fence annotation) and writes under it.
		b := podClient("replica-b")
		Expect(t.write(lg, 1, "from-b", writeOpts{via: b})).To(denied(fence.WrongOwner))
		Expect(t.write(lg, 1, "from-a", writeOpts{via: podClient("replica-a")})).To(Succeed())
		Expect(t.write(lg, 2, "intent-from-b", writeOpts{via: b, envelope: func(e *fence.Envelope) { e.Intent = fence.IntentDelete }})).
			To(denied(fence.WrongOwner))
		Expect(t.write(lg, 2, "x", writeOpts{via: podClient("replica-a"), envelope: func(e *fence.Envelope) { e.Intent = fence.IntentDelete }})).
			To(Succeed())
		// A delete declared by the holder's pod, sent by the other pod.
		Expect(b.Delete(suiteCtx, t.get())).To(denied(fence.WrongOwner))
		Expect(t.get()).NotTo(BeNil())
		// The ServiceAccount's identity without a pod (kubectl --as) neither.
		asSA := impersonating(sa, workersGroup, "system:authenticated")
		Expect(asSA.Delete(suiteCtx, t.get())).To(denied(fence.WrongOwner))
		Expect(podClient("replica-a").Delete(suiteCtx, t.get())).To(Succeed())
	})

	It("lets only the requesting pod renew, release or withdraw its LockGrant", func() {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		lock := mustAcquire(podLocks("replica-a"), "batch", "job-1")
		lg := getGrant(ns, lock.Name())
		b := podClient("replica-b")
		for what, mutate := range map[string]func(*locksv1.LockGrant){
			"renew":   func(g *locksv1.LockGrant) { g.Spec.Renewals++ },
			"release": func(g *locksv1.LockGrant) { g.Spec.Release = true },
			"label":   func(g *locksv1.LockGrant) { g.Labels = map[string]string{"x": "y"} },
		} {
			err := update(b, lg.DeepCopy(), mutate)
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%s from the other replica: %v", what, err)
			Expect(err).To(MatchError(ContainSubstring(string(fence.WrongOwner) + ": the LockGrant is bound to its requester's pod")))
		}
		Expect(apierrors.IsForbidden(b.Delete(suiteCtx, lg.DeepCopy()))).To(BeTrue())
		after := getGrant(ns, lg.Name)
		Expect([]any{after.Spec.Release, after.Spec.Renewals, after.Labels, after.DeletionTimestamp}).To(Equal([]any{false, lg.Spec.Renewals, lg.Labels, lg.DeletionTimestamp}))

		// The other replica's client refuses to attach to it.
		_, err := podLocks("replica-b").Attach(suiteCtx, lg.Name, lockclient.AcquireOptions{})
		Expect(err).To(MatchError(lockclient.ErrWrongOwner))

		// The requesting pod renews and releases as always.
		ctx, cancel := context.WithTimeout(suiteCtx, 20*time.Second)
		defer cancel()
		Expect(lock.Release(ctx)).To(Succeed())
	})

	It("refuses a LockGrant whose lease names another pod, or a pod the request does not come from", func() {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		forged := newGrant(ns, "batch", sa, "job-2")
		forged.Spec.Lease = grant.PodLease(podUID["replica-a"])
		err := podClient("replica-b").Create(suiteCtx, forged)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err).To(MatchError(ContainSubstring(`spec.lease: Invalid value: "pod:` + podUID["replica-a"] + `": must be "pod:` + podUID["replica-b"] + `"`)))

		err = impersonating(sa, workersGroup, "system:authenticated").Create(suiteCtx, newGrant(ns, "batch", sa, "job-3"))
		Expect(err).NotTo(HaveOccurred(), "a request without a pod keeps its own lease")
		err = impersonating(sa, workersGroup, "system:authenticated").Create(suiteCtx, forged.DeepCopy())
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err).To(MatchError(ContainSubstring(`must not start with "pod:"`)))

		// A pod's client fills the lease in, and refuses one that is not its pod's.
		_, err = podLocks("replica-b").Acquire(suiteCtx, "batch", lockclient.AcquireOptions{RequestID: "job-4", Lease: "mine"})
		Expect(err).To(MatchError(ContainSubstring("whose requests are bound to it")))
		Expect(errors.Is(err, lockclient.ErrWrongOwner)).To(BeFalse())
	})
})
