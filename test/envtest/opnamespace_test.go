package envtest

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	fkoperator "github.com/fencekeeper/fencekeeper/internal/operator"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// Everything else the operator keeps in its namespace besides the trust
// anchors: the webhook serving certificate, the key-rotation request, the
// verifier Leases, the target claims and the leader-election Lease. A user
// bound to the built-in edit ClusterRole there writes each of them only
// through the policy, which refuses. The refused writes are dry runs: before
// the policy guarded them, they would have landed in the suite's namespace.
var _ = Describe("the operator namespace", Ordered, func() {
	var (
		editor      client.Client // the built-in edit ClusterRole in the operator namespace
		rotator     client.Client // edit, plus verb rotate on trustanchors named after the request
		certManager client.Client // the user the policy names as cert-manager's
		opClient    client.Client
		stopGuard   func()
	)
	dry := client.DryRunAll
	lease := func(name string, labels map[string]string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: name, Labels: labels},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("forged"), LeaseDurationSeconds: ptr.To(int32(1 << 30)),
				RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	}

	BeforeAll(func() {
		edit := aggregateClusterRoles("edit")
		AddReportEntry("rules of the edit ClusterRole", edit.Rules)
		editor = boundUser("opns-editor", &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: "opns-editor"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"}})
		Expect(admin.Create(suiteCtx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: "opns-rotator"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{locksv1.GroupVersion.Group}, Resources: []string{fkoperator.TrustAnchorResource},
				ResourceNames: []string{locksv1.KeyRotationConfigMap}, Verbs: []string{fkoperator.TrustAnchorRotateVerb}},
		}})).To(Succeed())
		Expect(admin.Create(suiteCtx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: "opns-rotator-edit"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "opns-rotator"}},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"}})).To(Succeed())
		rotator = boundUser("opns-rotator", &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: "opns-rotator"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "opns-rotator"}})
		Expect(admin.Create(suiteCtx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: "opns-cert-manager"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"*"}}}})).To(Succeed())
		certManager = boundUser(certManagerUser, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: "opns-cert-manager"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "opns-cert-manager"}})
		var err error
		opClient, err = client.New(opCfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		stopGuard = startGuard(suiteKinds)
		Eventually(func() error {
			return setAnchorData(editor, locksv1.TrustBundleConfigMap, grant.RevokedBelowEpochKey, "0", dry)
		}).Should(notOperator)
	})

	AfterAll(func() {
		if stopGuard != nil {
			stopGuard()
		}
		removeTrustAnchorPolicy(admin)
		for _, obj := range []client.Object{
			&corev1.Secret{ObjectMeta: objectMeta(opNamespace, locksv1.SelfSignedCertSecret)},
			&corev1.Secret{ObjectMeta: objectMeta(opNamespace, locksv1.CertManagerCertSecret)},
			&corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, locksv1.KeyRotationConfigMap)},
			&coordinationv1.Lease{ObjectMeta: objectMeta(opNamespace, locksv1.LeaderElectionID)},
		} {
			Expect(client.IgnoreNotFound(admin.Delete(suiteCtx, obj))).To(Succeed())
		}
	})

	It("lets only the operator (and cert-manager, its own) write the webhook serving certificate", func() {
		tls := func(name string) *corev1.Secret {
			return &corev1.Secret{ObjectMeta: objectMeta(opNamespace, name), Type: corev1.SecretTypeTLS,
				Data: map[string][]byte{"tls.crt": []byte("crt"), "tls.key": []byte("key"), "ca.crt": []byte("ca")}}
		}
		secret := func(name string) *corev1.Secret { return &corev1.Secret{ObjectMeta: objectMeta(opNamespace, name)} }
		setCA := func(c client.Client, name string, opts ...client.UpdateOption) error {
			return update(c, secret(name), func(s *corev1.Secret) { s.Data["ca.crt"] = []byte("another CA") }, opts...)
		}
		var attempts []attempt
		for _, name := range []string{locksv1.SelfSignedCertSecret, locksv1.CertManagerCertSecret} {
			attempts = append(attempts, attempt{"edit creates " + name, func() error { return editor.Create(suiteCtx, tls(name), dry) }})
		}
		allRefused(attempts...)

		Expect(opClient.Create(suiteCtx, tls(locksv1.SelfSignedCertSecret))).To(Succeed())
		Expect(certManager.Create(suiteCtx, tls(locksv1.CertManagerCertSecret))).To(Succeed())
		attempts = nil
		for _, name := range []string{locksv1.SelfSignedCertSecret, locksv1.CertManagerCertSecret} {
			attempts = append(attempts,
				attempt{"edit replaces the CA of " + name, func() error { return setCA(editor, name, dry) }},
				attempt{"edit labels " + name, func() error {
					return update(editor, secret(name), func(s *corev1.Secret) { s.Labels = map[string]string{"touched": "yes"} }, dry)
				}},
				attempt{"edit deletes " + name, func() error { return editor.Delete(suiteCtx, secret(name), dry) }})
		}
		attempts = append(attempts, attempt{"cert-manager replaces the CA of the operator's " + locksv1.SelfSignedCertSecret,
			func() error { return setCA(certManager, locksv1.SelfSignedCertSecret, dry) }})
		allRefused(attempts...)

		// cert-manager renews its own Secret; the operator renews its own.
		Expect(setCA(certManager, locksv1.CertManagerCertSecret)).To(Succeed())
		Expect(setCA(opClient, locksv1.SelfSignedCertSecret)).To(Succeed())
		Expect(certManager.Delete(suiteCtx, secret(locksv1.CertManagerCertSecret))).To(Succeed())
	})

	It("lets only the operator and a user allowed to rotate write the key-rotation request, and only the operator its report", func() {
		request := func(data map[string]string) *corev1.ConfigMap {
			return &corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, locksv1.KeyRotationConfigMap), Data: data}
		}
		asked := map[string]string{locksv1.RotationRequestKey: "now"}
		forged := map[string]string{locksv1.RotationRequestKey: "now", locksv1.RotationStatusPrefix + "phase": "Complete"}
		allRefused(
			attempt{"edit requests a rotation (create)", func() error { return editor.Create(suiteCtx, request(asked), dry) }},
			attempt{"a rotator creates the request with the operator's report", func() error { return rotator.Create(suiteCtx, request(forged), dry) }},
		)
		Expect(rotator.Create(suiteCtx, request(asked), dry)).To(Succeed())

		// A request ConfigMap without a request: the operator only reports into it.
		Expect(opClient.Create(suiteCtx, request(nil))).To(Succeed())
		Eventually(func() string {
			return anchorConfigMap(locksv1.KeyRotationConfigMap).Data[locksv1.RotationStatusPrefix+"phase"]
		}).Should(Equal("Idle"), "the operator's report did not land")
		ask := func(c client.Client) error {
			return update(c, request(nil), func(cm *corev1.ConfigMap) { cm.Data[locksv1.RotationRequestKey] = "now" }, dry)
		}
		forgeReport := func(c client.Client) error {
			return update(c, request(nil), func(cm *corev1.ConfigMap) { cm.Data[locksv1.RotationStatusPrefix+"phase"] = "Complete" }, dry)
		}
		allRefused(
			attempt{"edit requests a rotation (update)", func() error { return ask(editor) }},
			attempt{"edit deletes the request", func() error { return editor.Delete(suiteCtx, request(nil), dry) }},
			attempt{"a rotator forges the operator's report", func() error { return forgeReport(rotator) }},
			attempt{"a rotator drops the operator's report", func() error {
				return update(rotator, request(nil), func(cm *corev1.ConfigMap) { delete(cm.Data, locksv1.RotationStatusPrefix+"phase") }, dry)
			}},
		)
		Expect(ask(rotator)).To(Succeed())
		Expect(forgeReport(opClient)).To(Succeed())
	})

	It("lets only the operator write its verifier Leases, target claims and leader-election Lease", func() {
		verifierLabels := map[string]string{locksv1.LabelComponent: locksv1.ComponentVerifier}
		claimLabels := map[string]string{locksv1.LabelComponent: locksv1.ComponentTargetClaim}
		leaseNamed := func(name string) *coordinationv1.Lease {
			return &coordinationv1.Lease{ObjectMeta: objectMeta(opNamespace, name)}
		}
		var live coordinationv1.LeaseList
		Eventually(func() []coordinationv1.Lease {
			Expect(admin.List(suiteCtx, &live, client.InNamespace(opNamespace), client.MatchingLabels(verifierLabels))).To(Succeed())
			return live.Items
		}).ShouldNot(BeEmpty(), "the suite's webhook replica reports no verifier Lease")
		replica := live.Items[0].Name

		// The create webhook claims the target as the operator, through the policy.
		ns := newNamespace()
		newFencedResource(ns, "claimed", 10, func(fr *locksv1.FencedResource) {
			fr.Spec.Target = &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: "claimed"}
		})
		claim := locksv1.TargetClaimName(ns, locksv1.TargetKey("", "ConfigMap", "claimed"))
		Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace, Name: claim}, &coordinationv1.Lease{})).To(Succeed())
		squat := locksv1.TargetClaimName(ns, locksv1.TargetKey("", "ConfigMap", "not-yet-protected"))

		allRefused(
			attempt{"edit forges a verifier Lease", func() error {
				return editor.Create(suiteCtx, lease(locksv1.VerifierLeasePrefix+"forged", verifierLabels), dry)
			}},
			attempt{"edit creates an unlabelled Lease named like a verifier's", func() error {
				return editor.Create(suiteCtx, lease(locksv1.VerifierLeasePrefix+"unlabelled", nil), dry)
			}},
			attempt{"edit creates a Lease labelled as a verifier's", func() error {
				return editor.Create(suiteCtx, lease("labelled-only", verifierLabels), dry)
			}},
			attempt{"edit forges a live verifier's report", func() error {
				return update(editor, leaseNamed(replica), func(l *coordinationv1.Lease) { l.Annotations[locksv1.AnnotationVerifierKeys] = "k-forged" }, dry)
			}},
			attempt{"edit unlabels a live verifier's Lease", func() error {
				return update(editor, leaseNamed(replica), func(l *coordinationv1.Lease) { delete(l.Labels, locksv1.LabelComponent) }, dry)
			}},
			attempt{"edit deletes a live verifier's Lease", func() error { return editor.Delete(suiteCtx, leaseNamed(replica), dry) }},
			attempt{"edit takes over a target claim", func() error {
				return update(editor, leaseNamed(claim), func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To(ns + "/someone-else") }, dry)
			}},
			attempt{"edit deletes a target claim", func() error { return editor.Delete(suiteCtx, leaseNamed(claim), dry) }},
			attempt{"edit claims a target first", func() error { return editor.Create(suiteCtx, lease(squat, claimLabels), dry) }},
			attempt{"edit creates a Lease labelled as a target claim", func() error {
				return editor.Create(suiteCtx, lease("claim-by-label", claimLabels), dry)
			}},
			attempt{"edit takes the leader-election Lease", func() error {
				return editor.Create(suiteCtx, lease(locksv1.LeaderElectionID, nil), dry)
			}},
		)

		By("the leader-election Lease, once the operator holds it")
		Expect(opClient.Create(suiteCtx, lease(locksv1.LeaderElectionID, nil))).To(Succeed())
		allRefused(
			attempt{"edit holds the leader-election Lease", func() error {
				return update(editor, leaseNamed(locksv1.LeaderElectionID), func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("nobody-ever") }, dry)
			}},
			attempt{"edit deletes the leader-election Lease", func() error { return editor.Delete(suiteCtx, leaseNamed(locksv1.LeaderElectionID), dry) }},
			// Admitted item by item, each under an empty request name.
			attempt{"edit deletes every Lease (delete-collection)", func() error {
				return editor.DeleteAllOf(suiteCtx, &coordinationv1.Lease{}, client.InNamespace(opNamespace), dry)
			}},
		)
		Expect(update(opClient, leaseNamed(locksv1.LeaderElectionID), func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("replica-1") })).To(Succeed())
		Expect(opClient.Delete(suiteCtx, leaseNamed(locksv1.LeaderElectionID))).To(Succeed())

		By("the webhook replica keeps renewing its verifier Lease through the policy")
		renewed := func() time.Time {
			var l coordinationv1.Lease
			Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace, Name: replica}, &l)).To(Succeed())
			return l.Spec.RenewTime.Time
		}
		before := renewed()
		Eventually(renewed).Should(BeTemporally(">", before), "the webhook replica could not renew its verifier Lease")

		By("other Leases in the namespace are not the policy's")
		Expect(editor.Create(suiteCtx, lease("someone-elses", nil), dry)).To(Succeed())
	})

	// What the policy cannot stop, shown so that docs/security.md says it
	// truly: edit may impersonate every service account of the namespace,
	// the operator's included, and the API server then admits the request
	// as the operator's.
	It("cannot tell the operator from an edit user impersonating its service account", func() {
		u, err := cp.AddUser("opns-editor")
		Expect(err).NotTo(HaveOccurred())
		cfg := u.Config()
		cfg.Impersonate = rest.ImpersonationConfig{UserName: locksv1.OperatorUsername(opNamespace)}
		as, err := client.New(cfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		Expect(update(as, &corev1.Secret{ObjectMeta: objectMeta(opNamespace, locksv1.SigningKeySecret)}, func(s *corev1.Secret) {
			s.Data["ed25519.seed"] = make([]byte, 32)
		}, dry)).To(Succeed())
	})
})

// attempt is one write and what it tries.
type attempt struct {
	what  string
	write func() error
}

// allRefused makes every attempt and fails naming each one the policy did
// not refuse, so that one run shows every write that lands.
func allRefused(attempts ...attempt) {
	GinkgoHelper()
	var landed []string
	for _, a := range attempts {
		err := a.write()
		if ok, _ := notOperator.Match(err); !ok {
			landed = append(landed, fmt.Sprintf("%s: %v", a.what, err))
			continue
		}
		AddReportEntry(a.what, err.Error())
	}
	Expect(landed).To(BeEmpty(), "writes the policy did not refuse (<nil>: the write was admitted)")
}

// certManagerUser is the user the suite's policy names as cert-manager's.
const certManagerUser = locksv1.CertManagerUsername
