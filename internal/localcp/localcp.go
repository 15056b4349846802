// Package localcp runs fencekeeper's embedded local control plane: a real
// etcd and kube-apiserver (the binaries hack/build-control-plane.sh builds into
// bin/k8s) and, when asked, kube-controller-manager's namespace and
// garbage-collector controllers, with the CRDs, the webhook configuration and
// the RBAC of an installation, and distinct authenticated users: the operator's service
// account bound only to the generated role, and workers bound to the
// lockgrant-requester role. The envtest suites, make demo, make dev and the
// benchmarks all start it the same way.
package localcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

const (

	// WorkersGroup is bound to the lockgrant-requester role and may write protected objects.
	WorkersGroup = "fencekeeper:workers"
	// ProtectedWebhook is the protected-object webhook's name in that configuration.
	ProtectedWebhook = "vprotected.fencekeeper.dev"
	// EnrolledWebhook is the entry that sees unlabelled objects in enrolled namespaces.
	EnrolledWebhook = "vprotected-enrolled.fencekeeper.dev"
)

// Options describe what to install besides fencekeeper's own manifests.
type Options struct {
	// Root is the repository root (default: found from the working directory).
	Root string
	// Assets holds etcd and kube-apiserver (default: $KUBEBUILDER_ASSETS, else Root/bin/k8s).
	Assets string
	// CRDDirs are extra CRD directories (custom kinds to protect).
	CRDDirs []string
	// ProtectedKinds are custom kinds the protected-object webhook also covers
	// (ConfigMaps always are); workers may write them and the operator reads them.
	ProtectedKinds []schema.GroupVersionResource
	// EnvtestWebhooks lets envtest install the webhook configuration with its
	// own serving certificate (Env.WebhookInstallOptions tells where to serve).
	// Otherwise call InstallWebhooks and run the operator with self-signed certificates.
	EnvtestWebhooks bool
	// Bare starts an empty cluster: no CRDs but CRDDirs, no namespace, RBAC
	// or operator user, for installing fencekeeper as a release would
	// (make dev BARE=1). Its API server resolves webhook Services through
	// their EndpointSlices (--enable-aggregator-routing), since there is no
	// cluster DNS or kube-proxy: whoever runs a pod publishes its address.
	Bare bool
	// ControllerManager also runs kube-controller-manager (from Assets) with
	// its namespace and garbage-collector controllers, so that a deleted
	// namespace is emptied and removed, and dependents of a deleted owner are
	// collected, as in a cluster. make dev, make demo and the envtest suite
	// run it; without it a deleted namespace stays Terminating.
	ControllerManager bool
}

// ControlPlane is a running local control plane.
type ControlPlane struct {
	Env    *envtest.Environment
	Scheme *runtime.Scheme
	// Admin is a cluster-admin config; Operator is the RBAC-limited operator user's.
	Admin, Operator *rest.Config
	root            string
	opts            Options
	kcm             *ControllerManager
}

// Start starts etcd, kube-apiserver and (Options.ControllerManager)
// kube-controller-manager, installs the CRDs, the operator's namespace and
// RBAC, and the operator user.
func Start(ctx context.Context, o Options) (*ControlPlane, error) {
	if err := o.complete(); err != nil {
		return nil, err
	}
	cp := &ControlPlane{Scheme: locksv1.Scheme, root: o.Root, opts: o}
	crds := append([]string{filepath.Join(o.Root, "config", "crd", "bases")}, o.CRDDirs...)
	if o.Bare {
		crds = o.CRDDirs
	}
	cp.Env = &envtest.Environment{
		CRDDirectoryPaths:     crds,
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: o.Assets,
	}
	if o.Bare {
		cp.Env.ControlPlane.GetAPIServer().Configure().Set("enable-aggregator-routing", "true")
	}
	if o.EnvtestWebhooks {
		hooks, err := cp.WebhookConfigurations()
		if err != nil {
			return nil, err
		}
		cp.Env.WebhookInstallOptions = envtest.WebhookInstallOptions{ValidatingWebhooks: hooks}
	}
	var err error
	if cp.Admin, err = cp.Env.Start(); err != nil {
		return nil, fmt.Errorf("start the control plane: %w", err)
	}
	if o.ControllerManager {
		if err := cp.startControllerManager(ctx); err != nil {
			_ = cp.Env.Stop()
			return nil, err
		}
	}
	if o.Bare {
		return cp, nil
	}
	if err := cp.install(ctx); err != nil {
		_ = cp.Stop()
		return nil, err
	}
	return cp, nil
}

// complete fills in the defaults and checks the binaries are built.
func (o *Options) complete() error {
	if o.Root == "" {
		r, err := RepoRoot()
		if err != nil {
			return err
		}
		o.Root = r
	}
	if o.Assets == "" {
		o.Assets = os.Getenv("KUBEBUILDER_ASSETS")
	}
	if o.Assets == "" {
		o.Assets = filepath.Join(o.Root, "bin", "k8s")
	}
	for _, bin := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(o.Assets, bin)); err != nil {
			return fmt.Errorf("%s is not built in %s: run `make control-plane` (hack/build-control-plane.sh) first", bin, o.Assets)
		}
	}
	if _, err := os.Stat(filepath.Join(o.Assets, ControllerManagerBinary)); o.ControllerManager && err != nil {
		return fmt.Errorf("%s is not built in %s: run `make controller-manager` (hack/build-control-plane.sh kube-controller-manager) first", ControllerManagerBinary, o.Assets)
	}
	return nil
}

// startControllerManager runs kube-controller-manager as its own user, its
// output going where the API server's goes (envtest's
// KUBEBUILDER_ATTACH_CONTROL_PLANE_OUTPUT; otherwise only into errors).
func (cp *ControlPlane) startControllerManager(ctx context.Context) error {
	user, err := cp.AddUser(ControllerManagerUser)
	if err != nil {
		return err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	admin, err := cp.AdminClient()
	if err != nil {
		return err
	}
	cp.kcm, err = StartControllerManager(ctx, cp.opts.Assets, kubeconfig, cp.Env.ControlPlane.GetAPIServer().Err, admin)
	return err
}

// Stop stops kube-controller-manager, kube-apiserver and etcd and removes their data.
func (cp *ControlPlane) Stop() error {
	return errors.Join(cp.kcm.Stop(), cp.Env.Stop())
}

// Root is the repository root the manifests were read from.
func (cp *ControlPlane) Root() string { return cp.root }

// AdminClient is a cluster-admin client.
func (cp *ControlPlane) AdminClient() (client.WithWatch, error) {
	return client.NewWithWatch(cp.Admin, client.Options{Scheme: cp.Scheme})
}

// User is an authenticated user of the control plane.
type User = envtest.AuthenticatedUser

// AddUser adds an authenticated user; workers belong to WorkersGroup.
func (cp *ControlPlane) AddUser(name string, groups ...string) (*User, error) {
	return cp.Env.AddUser(envtest.User{Name: name, Groups: groups}, cp.Admin)
}

// install creates the operator namespace and binds the generated RBAC.
func (cp *ControlPlane) install(ctx context.Context) error {
	admin, err := cp.AdminClient()
	if err != nil {
		return err
	}
	if err := Install(ctx, admin, cp.root, cp.opts.ProtectedKinds); err != nil {
		return err
	}
	user, err := cp.AddUser(locksv1.OperatorUsername(locksv1.DefaultNamespace))
	if err != nil {
		return err
	}
	cp.Operator = rest.CopyConfig(user.Config())
	cp.Operator.QPS, cp.Operator.Burst = 500, 1000
	return nil
}

// Install creates, with a cluster-admin client, what an installation adds
// besides the CRDs: the operator namespace, the generated RBAC bound to the
// operator user, and the requester and protected-object-writer roles bound
// to WorkersGroup (kinds: the protected custom kinds). test/chaos installs
// its replicated control plane with it too.
func Install(ctx context.Context, admin client.Client, root string, kinds []schema.GroupVersionResource) error {
	ns := locksv1.DefaultNamespace
	objs := []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}}
	// The operator runs with exactly the generated RBAC (config/rbac/role.yaml),
	// which proves it sufficient; workers get the requester role.
	generated, err := LoadObjects(locksv1.Scheme, filepath.Join(root, "config", "rbac", "role.yaml"), filepath.Join(root, "config", "rbac", "lockgrant_requester_role.yaml"),
		filepath.Join(root, "config", "rbac", "leader_election_role.yaml"))
	if err != nil {
		return err
	}
	objs = append(objs, generated...)
	// Protected objects: workers write them, the operator reads custom targets
	// (an installation grants this per kind, see docs/protecting-objects.md).
	writeVerbs := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	writer := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: writeVerbs}}
	var reader []rbacv1.PolicyRule
	for _, k := range kinds {
		writer = append(writer, rbacv1.PolicyRule{APIGroups: []string{k.Group}, Resources: []string{k.Resource, k.Resource + "/scale", k.Resource + "/status"}, Verbs: writeVerbs})
		reader = append(reader, rbacv1.PolicyRule{APIGroups: []string{k.Group}, Resources: []string{k.Resource}, Verbs: []string{"get"}})
	}
	objs = append(objs,
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "protected-object-writer"}, Rules: writer},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "target-reader"}, Rules: reader})
	op := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: locksv1.OperatorUsername(locksv1.DefaultNamespace)}
	workers := rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: WorkersGroup}
	objs = append(objs,
		binding("ClusterRole", "manager-role", "", op),
		binding("ClusterRole", "target-reader", "", op),
		binding("Role", "manager-role", ns, op),
		binding("Role", "leader-election-role", ns, op),
		binding("ClusterRole", "lockgrant-requester", "", workers),
		binding("ClusterRole", "protected-object-writer", "", workers))
	for _, obj := range objs {
		if err := admin.Create(ctx, obj); err != nil {
			return fmt.Errorf("install %T %s: %w", obj, obj.GetName(), err)
		}
	}
	return nil
}

func binding(kind, role, ns string, subject rbacv1.Subject) client.Object {
	meta := metav1.ObjectMeta{Name: role + "-" + strings.ToLower(subject.Kind), Namespace: ns}
	ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: role}
	if kind == "Role" {
		return &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: []rbacv1.Subject{subject}}
	}
	return &rbacv1.ClusterRoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: []rbacv1.Subject{subject}}
}

// WebhookConfigurations are the generated webhook manifests named as
// config/default names them, with the protected-object webhook extended to
// the configured custom kinds (as an installation adds its own kinds).
func (cp *ControlPlane) WebhookConfigurations() ([]*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	return WebhookConfigurations(cp.root, cp.opts.ProtectedKinds)
}

// WebhookConfigurations reads root's generated webhook manifests, extended to kinds.
func WebhookConfigurations(root string, kinds []schema.GroupVersionResource) ([]*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	objs, err := LoadObjects(locksv1.Scheme, filepath.Join(root, "config", "webhook", "manifests.yaml"))
	if err != nil {
		return nil, err
	}
	var out []*admissionregistrationv1.ValidatingWebhookConfiguration
	for _, obj := range objs {
		cfg, ok := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration)
		if !ok {
			continue
		}
		cfg.Name = locksv1.WebhookConfigurationName
		for i := range cfg.Webhooks {
			if name := cfg.Webhooks[i].Name; name != ProtectedWebhook && name != EnrolledWebhook {
				continue
			}
			for _, k := range kinds {
				// The kind and every subresource: /scale changes content too.
				rule := cfg.Webhooks[i].Rules[0].DeepCopy()
				rule.APIGroups, rule.APIVersions, rule.Resources = []string{k.Group}, []string{k.Version}, []string{k.Resource, k.Resource + "/*"}
				cfg.Webhooks[i].Rules = append(cfg.Webhooks[i].Rules, *rule)
			}
		}
		out = append(out, cfg)
	}
	if len(out) == 0 {
		return nil, errors.New("config/webhook/manifests.yaml has no ValidatingWebhookConfiguration: run make manifests")
	}
	return out, nil
}

// InstallWebhooks installs the webhook configuration pointing at an operator
// serving on https://host:port, without a caBundle: the operator's
// self-signed-certificate mode patches it in, as it does in a cluster without
// cert-manager. It replaces configurations an earlier call installed.
func (cp *ControlPlane) InstallWebhooks(ctx context.Context, host string, port int) error {
	admin, err := cp.AdminClient()
	if err != nil {
		return err
	}
	cfgs, err := cp.WebhookConfigurations()
	if err != nil {
		return err
	}
	return InstallWebhooks(ctx, admin, cfgs, host, port)
}

// InstallWebhooks installs cfgs with every webhook pointed at
// https://host:port (see ControlPlane.InstallWebhooks).
func InstallWebhooks(ctx context.Context, admin client.Client, cfgs []*admissionregistrationv1.ValidatingWebhookConfiguration, host string, port int) error {
	for _, cfg := range cfgs {
		for i := range cfg.Webhooks {
			cc := &cfg.Webhooks[i].ClientConfig
			url := fmt.Sprintf("https://%s:%d%s", host, port, *cc.Service.Path)
			cc.Service, cc.URL = nil, &url
		}
		err := admin.Create(ctx, cfg)
		if apierrors.IsAlreadyExists(err) {
			// An earlier install pointed at another operator: replace it.
			if err = admin.Delete(ctx, cfg.DeepCopy()); client.IgnoreNotFound(err) == nil {
				err = admin.Create(ctx, cfg)
			}
		}
		if err != nil {
			return fmt.Errorf("install webhook configuration: %w", err)
		}
	}
	return nil
}

// RepoRoot finds the fencekeeper module root above the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(data), "module github.com/fencekeeper/fencekeeper\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run this from inside the fencekeeper repository (no go.mod of github.com/fencekeeper/fencekeeper above the working directory)")
		}
		dir = parent
	}
}

// LoadObjects reads multi-document YAML manifests into typed objects.
func LoadObjects(scheme *runtime.Scheme, paths ...string) ([]client.Object, error) {
	var out []client.Object
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); err == io.EOF {
				break
			} else if err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			obj, err := scheme.New(u.GroupVersionKind())
			if err == nil {
				err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj)
			}
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			out = append(out, obj.(client.Object))
		}
		f.Close()
	}
	return out, nil
}
