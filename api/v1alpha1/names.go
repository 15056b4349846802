package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// Names of one installation. Every binary, manifest generator and test takes
// them from here, so each has one home.
const (
	// DefaultNamespace is the operator's namespace: its signing key, trust
	// bundle, epoch record and leader-election lease live there.
	DefaultNamespace = "fencekeeper-system"
	// ServiceAccountName is the operator's service account in its namespace.
	ServiceAccountName = "fencekeeper-controller-manager"
	// SigningKeySecret holds the issuer's Ed25519 keys (docs/contract.md, "Keys and the trust bundle").
	SigningKeySecret = "fencekeeper-signing-key"
	// TrustBundleConfigMap holds the verifiers' public keys and revokedBelowEpoch (docs/contract.md, "Keys and the trust bundle").
	TrustBundleConfigMap = "fencekeeper-trust-bundle"
	// IssuerEpochConfigMap records the issuer epoch (a name of the product's own; the contract names none).
	IssuerEpochConfigMap = "fencekeeper-issuer-epoch"
	// KeyRotationConfigMap is the signing-key rotation request (written by
	// kubectl fence keys rotate) and the operator's report of its progress.
	// It is not a trust anchor: requesting a rotation never changes trust;
	// only the operator acts on it, through the anchors.
	KeyRotationConfigMap = "fencekeeper-key-rotation"
	// SelfSignedCertSecret holds the webhook serving certificate and its CA
	// when the operator manages them (--self-signed-certs): the replicas
	// serve it and the caBundle of the webhook configuration is its CA.
	SelfSignedCertSecret = "fencekeeper-webhook-self-signed-cert"
	// CertManagerCertSecret is where cert-manager writes the webhook serving
	// certificate in the installations that use it (config/certmanager, the
	// chart's default); cert-manager's cainjector puts its CA into the
	// webhook configuration.
	CertManagerCertSecret = "webhook-server-cert"
	// CertManagerUsername is the user cert-manager's controller writes
	// certificates as, in a default cert-manager installation.
	CertManagerUsername = "system:serviceaccount:cert-manager:cert-manager"
	// VerifierLeasePrefix starts the name of the Lease each webhook replica
	// renews in the operator namespace, reporting the trust bundle it has
	// loaded (AnnotationVerifierKeys, AnnotationVerifierRevokedBelow).
	VerifierLeasePrefix = "fencekeeper-verifier-"
	// TargetClaimPrefix starts the name of each target claim (see
	// TargetClaimName); its holderIdentity is "<namespace>/<FencedResource>".
	TargetClaimPrefix = "fencekeeper-target-"
	// LabelComponent tells the operator's Leases in its namespace apart:
	// ComponentVerifier (one per webhook replica) or ComponentTargetClaim
	// (one per protected object), so each reader lists only its own.
	LabelComponent       = "app.kubernetes.io/component"
	ComponentVerifier    = "verifier"
	ComponentTargetClaim = "target-claim"
	// AnnotationClaimedTarget on a target claim says, for people, which
	// object it claims: "<namespace>/<TargetKey>".
	AnnotationClaimedTarget = "fencekeeper.dev/claimed-target"
	// AnnotationVerifierKeys lists, comma-separated and sorted, the key IDs a
	// verifier replica trusts right now.
	AnnotationVerifierKeys = "fencekeeper.dev/trusted-keys"
	// AnnotationRetiredKeys, on the trust bundle, holds the public keys a
	// rotation retired (JSON keyID → base64 key). They never authenticate a
	// grant again; they only vouch for fence state already stored on objects,
	// which the webhook accepted while those keys were trusted.
	AnnotationRetiredKeys = "fencekeeper.dev/retired-keys"
	// AnnotationVerifierRevokedBelow is the revokedBelowEpoch a verifier replica enforces.
	AnnotationVerifierRevokedBelow = "fencekeeper.dev/revoked-below-epoch"
	// AnnotationVersion and AnnotationCommit, on a verifier Lease, name the
	// build (internal/version) the replica runs; kubectl fence version reads them.
	AnnotationVersion = "fencekeeper.dev/version"
	AnnotationCommit  = "fencekeeper.dev/commit"
	// WebhookConfigurationName is the ValidatingWebhookConfiguration of the installation.
	WebhookConfigurationName = "fencekeeper-validating-webhook-configuration"
	// AnnotationProtectedKinds, on the webhook configuration, lists the
	// declared protected kinds (comma-separated, --protected-kinds form). The
	// operator writes and keeps it, so that the FencedResource webhook and an
	// auditor who cannot see the manager's flags can tell a declared kind
	// from an undeclared one.
	AnnotationProtectedKinds = "fencekeeper.dev/protected-kinds"
	// AnnotationWebhookShapeGeneration, on the webhook configuration, is the
	// generation of the shape the operator that wrote it keeps
	// (internal/operator.WebhookShapeGeneration): an operator of an older
	// generation leaves the configuration alone, a newer one rewrites it.
	AnnotationWebhookShapeGeneration = "fencekeeper.dev/webhook-shape-generation"
	// ProtectedWebhookPath is where the protected-object (acceptance) webhook
	// is served; the plugin's audit looks for it in the configuration.
	ProtectedWebhookPath = "/validate-fencekeeper-protected"
	// LeaderElectionID names the leader-election Lease: its holder is the issuer.
	LeaderElectionID = "issuer.locks.fencekeeper.dev"
	// LockGrantResourceField is LockGrant's selectable field naming its
	// FencedResource (the API server filters by it).
	LockGrantResourceField = "spec.resource"
	// FencedResourceTargetField is the webhooks' cache index of
	// FencedResources by target ("group/kind/name", see TargetKey).
	FencedResourceTargetField = "spec.target"
	// FencedResourceTargetNameField is FencedResource's selectable field
	// naming its target object (the API server filters by it).
	FencedResourceTargetNameField = "spec.target.name"
	// LabelEnrolledNamespace marks a namespace that holds FencedResources:
	// the protected-object webhook sees every write of a protected kind there,
	// labelled or not. The operator sets and removes it; nobody else should.
	LabelEnrolledNamespace = "fencekeeper.dev/enrolled"
	// NamespaceControllerUsername is kube-controller-manager's namespace
	// controller with --use-service-account-credentials (kubeadm and most
	// distributions): while a namespace terminates it deletes everything in
	// it, so its deletes there are let through, audited.
	NamespaceControllerUsername = "system:serviceaccount:kube-system:namespace-controller"
)

// TargetKey is the index key of a target in its namespace. The version is
// left out on purpose: an object written through any served version of its
// kind is the same object.
func TargetKey(group, kind, name string) string {
	return group + "/" + kind + "/" + name
}

// TargetClaimName is the name of the Lease, in the operator's namespace,
// that claims a target for one FencedResource: "fencekeeper-target-" and 40
// hex digits of SHA-256 over the target's namespace and TargetKey. The
// FencedResource create webhook creates it, so the API server's name
// uniqueness decides between creates that race for one target.
func TargetClaimName(namespace, targetKey string) string {
	sum := sha256.Sum256([]byte(namespace + "\x00" + targetKey))
	return TargetClaimPrefix + hex.EncodeToString(sum[:20])
}

// LockGrantName is the name the client library gives the LockGrant in
// which owner requests resource with requestID: the resource name (cut to
// 200 characters, without a dot the cut leaves at its end, which would make
// the name invalid), a dash, and 16 lowercase hex digits of SHA-256 over
// resource, owner and requestID. The owner is in it, so no other owner can
// take the name before the owner's client does; the API server's name
// uniqueness makes (resource, owner, requestID) unique atomically, and a
// client whose create response was lost finds its request with a GET. A name
// of this form (LockGrantNameForm) is admitted only for its own request. The
// resource is a DNS name and the webhook refuses a requestID holding NUL, so
// no two requests hash the same bytes.
func LockGrantName(resource, owner, requestID string) string {
	sum := sha256.Sum256([]byte(resource + "\x00" + owner + "\x00" + requestID))
	name := resource
	if len(name) > 200 {
		name = strings.TrimRight(name[:200], ".")
	}
	return name + "-" + hex.EncodeToString(sum[:lockGrantNameDigits/2])
}

// lockGrantNameDigits is how many hex digits end a LockGrantName.
const lockGrantNameDigits = 16

// LockGrantNameForm reports whether name has LockGrantName's form: it ends in
// a dash and exactly 16 lowercase hex digits. The LockGrant webhook admits
// such a name only when it is LockGrantName of the LockGrant's own spec;
// any other name is free for LockGrants written by hand.
func LockGrantNameForm(name string) bool {
	i := strings.LastIndexByte(name, '-')
	if i < 0 || len(name)-i-1 != lockGrantNameDigits {
		return false
	}
	for _, c := range name[i+1:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// PodUIDExtra is the user-info extra in which the API server names the pod a
// bound service-account token was issued for (one value, the pod's UID).
const PodUIDExtra = "authentication.kubernetes.io/pod-uid"

// RequestPod is the UID of the pod a request comes from, by its user info's
// PodUIDExtra; "" when it names none (a person, kubectl, a worker outside the
// cluster) or names it ambiguously (not exactly one non-empty value, which
// no bound token produces).
func RequestPod(user authenticationv1.UserInfo) string {
	v := user.Extra[PodUIDExtra]
	if len(v) != 1 {
		return ""
	}
	return v[0]
}

// OperatorUsername is the Kubernetes user name of the operator's service
// account installed in namespace.
func OperatorUsername(namespace string) string {
	return "system:serviceaccount:" + namespace + ":" + ServiceAccountName
}

// Scheme knows the core Kubernetes types and the fencekeeper API. It is the
// one scheme of every binary, test and of the client library.
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(AddToScheme(s))
	return s
}()
