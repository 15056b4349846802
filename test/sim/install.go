package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

// The installation the simulated API server routes by. The registry-routing work found that a
// FencedResource could be created for a kind whose writes never reach the
// acceptance webhook: every write of its target then landed unchecked, and a
// model that only sends writes to the webhook could not see it. So each
// schedule's entry is admitted by the real FencedResource webhook, and the
// object's writes reach the acceptance webhook only when the configuration's
// rules route its kind there.
var (
	configMapsGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	// gadgetsGVR is served by the API server but not declared protected.
	gadgetsGVR = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "gadgets"}
)

// uncoveredKindOneIn: by default one schedule in this many registers its
// object as a Gadget, a kind the webhook configuration does not route.
const uncoveredKindOneIn = 50

// EntryAdmitFunc is the FencedResource webhook's decision on a create.
type EntryAdmitFunc func(context.Context, *locksv1.FencedResource) error

// installedWebhooks is the webhook configuration as the operator keeps it
// with widgets.example.com declared: both protected entries route ConfigMaps
// and widgets (with every subresource), nothing else. Written out here, not
// built with the operator's code, so that the routing below is the model's.
func installedWebhooks() *admissionregistrationv1.ValidatingWebhookConfiguration {
	ops := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete}
	rules := []admissionregistrationv1.RuleWithOperations{
		{Operations: ops, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}},
		{Operations: ops, Rule: admissionregistrationv1.Rule{APIGroups: []string{"example.com"}, APIVersions: []string{"v1"}, Resources: []string{"widgets", "widgets/*"}}},
	}
	path := locksv1.ProtectedWebhookPath
	entry := func(name string) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{Name: name, Rules: rules,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Name: "webhook", Path: &path}}}
	}
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: locksv1.WebhookConfigurationName, Annotations: map[string]string{locksv1.AnnotationProtectedKinds: "widgets.example.com/v1"}},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{entry("vprotected.fencekeeper.dev"), entry("vprotected-enrolled.fencekeeper.dev")},
	}
}

// apiServerRoutes is the API server's matching of rules
// (admissionregistration/v1): a request goes to a protected entry when one
// of its rules names the group, version, resource and operation ("*" names
// any). Selectors are modelled by resource.routed.
func apiServerRoutes(cfg *admissionregistrationv1.ValidatingWebhookConfiguration, gvr schema.GroupVersionResource, op admissionv1.Operation) bool {
	in := func(list []string, v string) bool { return slices.Contains(list, v) || slices.Contains(list, "*") }
	for _, w := range cfg.Webhooks {
		if w.ClientConfig.Service == nil || w.ClientConfig.Service.Path == nil || *w.ClientConfig.Service.Path != locksv1.ProtectedWebhookPath {
			continue
		}
		for _, r := range w.Rules {
			ops := make([]string, len(r.Operations))
			for i, o := range r.Operations {
				ops[i] = string(o)
			}
			if in(r.APIGroups, gvr.Group) && in(r.APIVersions, gvr.Version) && in(r.Resources, gvr.Resource) && in(ops, string(op)) {
				return true
			}
		}
	}
	return false
}

// simMapper serves the kinds of the simulated API server.
func simMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	m.Add(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, meta.RESTScopeNamespace)
	m.Add(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}, meta.RESTScopeNamespace)
	m.Add(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Gadget"}, meta.RESTScopeNamespace)
	return m
}

// uncoveredKindSchedule decides from the seed alone, on a stream of its own
// (the schedule's random stream, and so every other schedule, stays as it
// was), whether this schedule's object is a Gadget.
func uncoveredKindSchedule(seed uint64, cfg Config) bool {
	n := cfg.UncoveredKindOneIn
	if n == 0 {
		n = uncoveredKindOneIn
	}
	return n > 0 && rand.New(rand.NewPCG(seed, 0x6b696e64)).IntN(n) == 0
}

// twinPlan is how a co-tenant's second entry for the schedule's object
// races the first (test/envtest's targetclaim_test.go races real ones).
type twinPlan int

const (
	twinNone twinPlan = iota
	// twinInFlight: the second is admitted while the first is admitted but
	// not stored (their admissions overlap), and retried once it is.
	twinInFlight
	// twinAfter: the second comes after the first is stored, before the
	// webhook's cache has seen it.
	twinAfter
	// twinAfterCached: after, and the cache has seen the first.
	twinAfterCached
)

// twinEntryOneIn: by default one schedule in this many has a twin entry.
const twinEntryOneIn = 20

// twinSchedule decides from the seed alone, on a stream of its own, whether
// and how this schedule's entry gets a twin.
func twinSchedule(seed uint64, cfg Config) twinPlan {
	n := cfg.TwinEntryOneIn
	if n == 0 {
		n = twinEntryOneIn
	}
	rng := rand.New(rand.NewPCG(seed, 0x7477696e))
	if n <= 0 || rng.IntN(n) != 0 {
		return twinNone
	}
	plans := []twinPlan{twinInFlight, twinAfter, twinAfterCached}
	return plans[rng.IntN(len(plans))]
}

// register creates the schedule's FencedResource through the real
// FencedResource webhook. A refused entry ends the schedule: there is
// nothing to lock. The model's own routing says what the entry would protect.
func (w *world) register() {
	if w.uncovered {
		w.res.UncoveredEntries++
		w.kind = gadgetsGVR
		w.reg.fr.Spec.Target = &locksv1.ObjectTarget{APIVersion: "example.com/v1", Kind: "Gadget", Name: objectName}
	}
	v := &webhooks.FencedResourceValidator{Reader: apiReader{w.reg}, Index: indexReader{apiReader{w.reg}}, Writer: claimStore{r: w.reg},
		Mapper: simMapper(), WebhookConfiguration: locksv1.WebhookConfigurationName, Namespace: locksv1.DefaultNamespace,
		Bundle: &webhooks.TrustBundleSource{Reader: apiReader{w.reg}, Key: types.NamespacedName{Namespace: locksv1.DefaultNamespace, Name: locksv1.TrustBundleConfigMap}}}
	admit := EntryAdmitFunc(func(ctx context.Context, fr *locksv1.FencedResource) error {
		_, err := v.ValidateCreate(ctx, fr)
		return err
	})
	if w.cfg.EntryAdmission != nil {
		admit = w.cfg.EntryAdmission(admit)
	}
	// Admitted, not stored yet: the API server stores a create after its
	// webhooks answer, and a cache learns of it after that.
	w.reg.frUnstored, w.reg.indexBehind = true, true
	err := admit(context.Background(), w.reg.fr.DeepCopy())
	if err == nil && w.twin == twinInFlight {
		w.createTwin(admit, true)
	}
	w.reg.frUnstored = false
	if err == nil && w.twin != twinNone {
		w.reg.indexBehind = w.twin != twinAfterCached
		w.createTwin(admit, false)
	}
	w.reg.indexBehind = false
	routed := apiServerRoutes(w.webhooks, w.kind, admissionv1.Create) && apiServerRoutes(w.webhooks, w.kind, admissionv1.Update) &&
		apiServerRoutes(w.webhooks, w.kind, admissionv1.Delete)
	switch {
	case err != nil && routed:
		w.oracle.violation(vSimulator, "the entry for a routed kind %s was refused: %v", w.kind, err)
	case err != nil:
		w.entryRefused = true
		w.res.EntriesRefused++
		w.tracef("registry: entry for %s refused: %v", w.kind, err)
	case !routed:
		w.oracle.violation(vUncoveredEntry, "entry admitted for %s, whose writes the webhook configuration does not route", w.kind)
	}
}

// createTwin has a co-tenant create a second entry for the schedule's
// object (inFlight: while the first is admitted but not stored). One object
// has one entry: admitted, it is stored and reported.
func (w *world) createTwin(admit EntryAdmitFunc, inFlight bool) {
	if w.reg.twin != nil {
		return // admitted already (and reported)
	}
	w.res.TwinEntries++
	if inFlight {
		w.res.TwinsInFlight++
	}
	twin := w.reg.fr.DeepCopy()
	twin.Name, twin.UID, twin.Spec.ResourceID = resourceName+"-twin", "fr-twin-uid", resourceID+"-twin"
	if err := admit(context.Background(), twin.DeepCopy()); err != nil {
		w.res.TwinsRefused++
		w.tracef("registry: second entry %s for %s refused: %v", twin.Name, objectName, err)
		return
	}
	w.reg.twin = twin
	w.oracle.violation(vTwinEntry, "second entry %s admitted for %s, which %s protects (first entry stored: %t)",
		twin.Name, objectName, w.reg.fr.Name, !inFlight)
}

// claimStore is the API server's store of target claims (Leases): a name
// is created once, and an update must carry the current resourceVersion.
type claimStore struct {
	client.Writer
	r *registry
}

func (s claimStore) Create(_ context.Context, obj client.Object, _ ...client.CreateOption) error {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return fmt.Errorf("the simulator's registry writes only target claims, not %T", obj)
	}
	if _, taken := s.r.claims[l.Name]; taken && !s.r.w.cfg.unnamedClaims {
		return apierrors.NewAlreadyExists(coordinationv1.Resource("leases"), l.Name)
	}
	l.ResourceVersion, l.CreationTimestamp = s.r.revision(), metav1.Now()
	s.r.claims[l.Name] = l.DeepCopy()
	return nil
}

func (s claimStore) Update(_ context.Context, obj client.Object, _ ...client.UpdateOption) error {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return fmt.Errorf("the simulator's registry writes only target claims, not %T", obj)
	}
	cur, found := s.r.claims[l.Name]
	switch {
	case !found:
		return apierrors.NewNotFound(coordinationv1.Resource("leases"), l.Name)
	case cur.ResourceVersion != l.ResourceVersion:
		return apierrors.NewConflict(coordinationv1.Resource("leases"), l.Name, fmt.Errorf("resourceVersion %s is not %s", l.ResourceVersion, cur.ResourceVersion))
	}
	l.ResourceVersion = s.r.revision()
	s.r.claims[l.Name] = l.DeepCopy()
	return nil
}
