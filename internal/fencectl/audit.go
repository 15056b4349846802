package fencectl

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/protectedkinds"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// auditRow is one protected object (or one FencedResource target) and what
// the audit found about it.
type auditRow struct {
	Namespace      string                  `json:"namespace"`
	Object         string                  `json:"object"`
	APIVersion     string                  `json:"apiVersion"`
	Exists         bool                    `json:"exists"`
	FencedResource string                  `json:"fencedResource,omitempty"`
	Enforcement    locksv1.EnforcementMode `json:"enforcement,omitempty"`
	WebhookCovers  bool                    `json:"webhookCovers"`
	Gaps           []string                `json:"gaps,omitempty"`
}

type auditReport struct {
	Objects []auditRow `json:"objects"`
	Gaps    int        `json:"gaps"`
}

func (o *options) auditCmd() *cobra.Command {
	var all, requireEnforce bool
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Check every protected object has a FencedResource naming it and webhook coverage (exit 1 on a gap)",
		Long: `audit lists every object labeled fencekeeper.dev/protected=true (ConfigMaps,
the kinds FencedResources target and the kinds the acceptance webhook covers)
and every FencedResource target, and checks for each:
  - a FencedResource (annotation fencekeeper.dev/resource) whose target names it;
  - its enforcement mode (Shadow only warns; --require-enforce makes it a gap);
  - the acceptance webhook covers its kind for CREATE, UPDATE and DELETE, selects
    it, and fails closed (failurePolicy Fail);
  - a FencedResource target that exists carries the label and annotation.
It exits 1 when it finds a gap.`,
		Example: `  # What is protected in the namespace, and every gap
  kubectl fence audit -n billing

  # The whole cluster, Shadow counted as a gap: exits 1 on any (for CI or an alert)
  kubectl fence audit -A --require-enforce

  # The number of gaps only
  kubectl fence audit -A -o jsonpath='{.gaps}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			kube, err := o.kube()
			if err != nil {
				return err
			}
			ns := o.ns()
			if all {
				ns = ""
			}
			rep, err := audit(cmd.Context(), kube, ns, requireEnforce)
			if err != nil {
				return err
			}
			if err := o.emit(rep, nil, func(wide bool) error { return o.printAudit(rep, wide) }); err != nil {
				return err
			}
			if rep.Gaps > 0 {
				fmt.Fprintf(o.stderr, "audit found %d gap(s)\n", rep.Gaps)
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "Audit every namespace.")
	cmd.Flags().BoolVar(&requireEnforce, "require-enforce", false, "Count Shadow enforcement as a gap.")
	o.addOutputFlags(cmd, supportsWide)
	return cmd
}

// printAudit prints the audit table; wide adds the API version and whether
// the object exists.
func (o *options) printAudit(rep auditReport, wide bool) error {
	if len(rep.Objects) == 0 {
		o.printf("No protected objects and no FencedResource targets found.\n")
		return nil
	}
	header := []string{"NAMESPACE", "OBJECT", "FENCEDRESOURCE", "ENFORCEMENT", "WEBHOOK", "RESULT"}
	if wide {
		header = []string{"NAMESPACE", "OBJECT", "APIVERSION", "EXISTS", "FENCEDRESOURCE", "ENFORCEMENT", "WEBHOOK", "RESULT"}
	}
	tw := o.table(header...)
	for _, r := range rep.Objects {
		result := "ok"
		if len(r.Gaps) > 0 {
			result = "GAP: " + strings.Join(r.Gaps, "; ")
		} else if !r.Exists {
			result = "ok (not created yet)"
		}
		fr, enf := r.FencedResource, string(r.Enforcement)
		if fr == "" {
			fr, enf = "-", "-"
		}
		cols := []string{r.Namespace, r.Object, fr, enf, yesNo(r.WebhookCovers), result}
		if wide {
			cols = []string{r.Namespace, r.Object, r.APIVersion, yesNo(r.Exists), fr, enf, yesNo(r.WebhookCovers), result}
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	return tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// audit gathers protected objects and targets in ns ("" = all namespaces).
func audit(ctx context.Context, kube client.Client, ns string, requireEnforce bool) (auditReport, error) {
	var frs locksv1.FencedResourceList
	if err := kube.List(ctx, &frs, client.InNamespace(ns)); err != nil {
		return auditReport{}, explainAPI(err, "FencedResources")
	}
	hooks, declared, err := acceptanceWebhooks(ctx, kube)
	if err != nil {
		return auditReport{}, err
	}
	a := &auditor{kube: kube, hooks: hooks, declared: declared, nsLabels: map[string]map[string]string{}, frs: map[client.ObjectKey]*locksv1.FencedResource{}, requireEnforce: requireEnforce}
	for i := range frs.Items {
		a.frs[client.ObjectKeyFromObject(&frs.Items[i])] = &frs.Items[i]
	}
	rows, err := a.labeledObjects(ctx, ns, auditedKinds(kube, frs.Items, hooks))
	if err != nil {
		return auditReport{}, err
	}
	rows = append(rows, a.unlabeledTargets(ctx, frs.Items, rows)...)
	return newAuditReport(rows), nil
}

// acceptanceWebhooks returns the acceptance webhook's entries of every
// configuration and the kinds the operator declared it protects (nil: no
// operator has recorded its declared kinds).
func acceptanceWebhooks(ctx context.Context, kube client.Client) ([]admissionregistrationv1.ValidatingWebhook, map[string]bool, error) {
	var cfgs admissionregistrationv1.ValidatingWebhookConfigurationList
	if err := kube.List(ctx, &cfgs); err != nil {
		return nil, nil, fmt.Errorf("read the webhook configurations (an auditor needs list on validatingwebhookconfigurations): %w", err)
	}
	var hooks []admissionregistrationv1.ValidatingWebhook
	var declared map[string]bool
	for _, c := range cfgs.Items {
		protects := false
		for _, w := range c.Webhooks {
			if protectedkinds.IsProtectedEntry(&w) {
				hooks = append(hooks, w)
				protects = true
			}
		}
		if list, ok := c.Annotations[locksv1.AnnotationProtectedKinds]; ok && protects {
			declared = protectedkinds.Declared(declared, list)
		}
	}
	return hooks, declared, nil
}

// auditedKinds returns the kinds to look at: ConfigMaps, FencedResource
// targets, webhook rules.
func auditedKinds(kube client.Client, frs []locksv1.FencedResource, hooks []admissionregistrationv1.ValidatingWebhook) map[schema.GroupVersionKind]bool {
	kinds := map[schema.GroupVersionKind]bool{{Version: "v1", Kind: "ConfigMap"}: true}
	for _, fr := range frs {
		if t := fr.Spec.Target; t != nil {
			kinds[schema.FromAPIVersionAndKind(t.APIVersion, t.Kind)] = true
		}
	}
	for _, w := range hooks {
		for _, r := range w.Rules {
			for _, res := range ruleResources(r) {
				if gvk, err := kube.RESTMapper().KindFor(res); err == nil {
					kinds[gvk] = true
				}
			}
		}
	}
	return kinds
}

// ruleResources lists the resources a webhook rule names one by one:
// wildcards and subresources name no single kind and are left out.
func ruleResources(r admissionregistrationv1.RuleWithOperations) []schema.GroupVersionResource {
	var out []schema.GroupVersionResource
	for _, g := range r.APIGroups {
		for _, v := range r.APIVersions {
			for _, res := range r.Resources {
				if g == "*" || v == "*" || res == "*" || strings.Contains(res, "/") {
					continue
				}
				out = append(out, schema.GroupVersionResource{Group: g, Version: v, Resource: res})
			}
		}
	}
	return out
}

// labeledObjects audits every object of kinds labeled protected in ns.
func (a *auditor) labeledObjects(ctx context.Context, ns string, kinds map[schema.GroupVersionKind]bool) ([]auditRow, error) {
	var rows []auditRow
	for gvk := range kinds {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		err := a.kube.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{fence.LabelProtected: "true"})
		if err != nil {
			return nil, fmt.Errorf("list protected %s objects: %w", gvk.Kind, err)
		}
		for i := range list.Items {
			rows = append(rows, a.object(ctx, gvk, &list.Items[i]))
		}
	}
	return rows, nil
}

// unlabeledTargets audits the FencedResource targets that are not among
// labeled: targets that exist without the label, or do not exist yet.
func (a *auditor) unlabeledTargets(ctx context.Context, frs []locksv1.FencedResource, labeled []auditRow) []auditRow {
	seen := map[string]bool{}
	for _, row := range labeled {
		seen[row.Namespace+"/"+row.Object] = true
	}
	var rows []auditRow
	for i := range frs {
		fr := &frs[i]
		t := fr.Spec.Target
		if t == nil {
			continue
		}
		name := t.Kind + "/" + t.Name
		if seen[fr.Namespace+"/"+name] {
			continue
		}
		rows = append(rows, a.unlabeledTarget(ctx, fr))
	}
	return rows
}

// newAuditReport sorts the rows by namespace and object and counts their gaps.
func newAuditReport(rows []auditRow) auditReport {
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Namespace != rows[j].Namespace {
			return rows[i].Namespace < rows[j].Namespace
		}
		return rows[i].Object < rows[j].Object
	})
	rep := auditReport{Objects: rows}
	if rep.Objects == nil {
		rep.Objects = []auditRow{}
	}
	for _, r := range rows {
		rep.Gaps += len(r.Gaps)
	}
	return rep
}

type auditor struct {
	kube           client.Client
	hooks          []admissionregistrationv1.ValidatingWebhook
	declared       map[string]bool
	frs            map[client.ObjectKey]*locksv1.FencedResource
	nsLabels       map[string]map[string]string
	requireEnforce bool
}

// object audits one labeled protected object.
func (a *auditor) object(ctx context.Context, gvk schema.GroupVersionKind, obj *unstructured.Unstructured) auditRow {
	row := auditRow{Namespace: obj.GetNamespace(), Object: gvk.Kind + "/" + obj.GetName(), APIVersion: gvk.GroupVersion().String(), Exists: true}
	row.WebhookCovers, row.Gaps = a.covers(ctx, gvk, obj.GetNamespace(), obj.GetLabels())
	if covered, _ := a.covers(ctx, gvk, obj.GetNamespace(), nil); !covered {
		row.Gaps = append(row.Gaps, fmt.Sprintf("namespace %s is not enrolled (label %s=true): a write that drops the label is not seen (the operator enrolls namespaces that hold FencedResources)",
			obj.GetNamespace(), locksv1.LabelEnrolledNamespace))
	}
	frName := obj.GetAnnotations()[fence.AnnotationResource]
	if frName == "" {
		row.Gaps = append(row.Gaps, "no fencekeeper.dev/resource annotation (fix: annotate it with the FencedResource that protects it)")
		return row
	}
	row.FencedResource = frName
	fr := a.frs[client.ObjectKey{Namespace: obj.GetNamespace(), Name: frName}]
	if fr == nil {
		row.Gaps = append(row.Gaps, fmt.Sprintf("FencedResource %s does not exist (fix: create it with target %s)", frName, row.Object))
		return row
	}
	row.Enforcement = enforcementOf(fr)
	if t := fr.Spec.Target; t == nil || t.APIVersion != row.APIVersion || t.Kind != gvk.Kind || t.Name != obj.GetName() {
		row.Gaps = append(row.Gaps, fmt.Sprintf("FencedResource %s does not target this object", frName))
	}
	if a.requireEnforce && row.Enforcement != locksv1.EnforcementEnforce {
		row.Gaps = append(row.Gaps, "enforcement is Shadow (fix: set spec.enforcement: Enforce once the would-deny warnings are understood)")
	}
	return row
}

// unlabeledTarget audits a FencedResource target the label search did not find.
func (a *auditor) unlabeledTarget(ctx context.Context, fr *locksv1.FencedResource) auditRow {
	t := fr.Spec.Target
	gvk := schema.FromAPIVersionAndKind(t.APIVersion, t.Kind)
	row := auditRow{Namespace: fr.Namespace, Object: t.Kind + "/" + t.Name, APIVersion: t.APIVersion, FencedResource: fr.Name, Enforcement: enforcementOf(fr)}
	// Unlabelled (absent, or created by someone else): only the enrolled
	// namespace's entry sees its writes.
	row.WebhookCovers, row.Gaps = a.covers(ctx, gvk, fr.Namespace, nil)
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	err := a.kube.Get(ctx, client.ObjectKey{Namespace: fr.Namespace, Name: t.Name}, obj)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		row.Gaps = append(row.Gaps, fmt.Sprintf("cannot read the target: %v", err))
	default:
		row.Exists = true
	}
	if a.requireEnforce && row.Enforcement != locksv1.EnforcementEnforce {
		row.Gaps = append(row.Gaps, "enforcement is Shadow")
	}
	return row
}

// covers says whether an acceptance webhook sees CREATE, UPDATE and DELETE of
// gvk objects with these labels in namespace ns, and fails closed.
func (a *auditor) covers(ctx context.Context, gvk schema.GroupVersionKind, ns string, objLabels map[string]string) (bool, []string) {
	mapping, err := a.kube.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return false, []string{fmt.Sprintf("kind %s is not served by the API server", gvk)}
	}
	res := mapping.Resource
	nsLabels, err := a.namespaceLabels(ctx, ns)
	if err != nil {
		return false, []string{fmt.Sprintf("cannot read namespace %s: %v", ns, err)}
	}
	var gaps []string
	if g := a.undeclared(res); g != "" {
		gaps = append(gaps, g)
	}
	for _, w := range a.hooks {
		if !protectedkinds.RulesCover(w.Rules, res) || !selects(w.ObjectSelector, objLabels) || !selects(w.NamespaceSelector, nsLabels) {
			continue
		}
		if g := protectedkinds.EntryGap(&w, res); g != "" {
			gaps = append(gaps, g)
		}
		return true, gaps
	}
	return false, append(gaps, fmt.Sprintf("the acceptance webhook does not cover %s here (fix: declare it, --protected-kinds=%s or the chart value protectedKinds; docs/protecting-objects.md)",
		res.GroupResource(), protectedkinds.Format(res)))
}

// undeclared names the gap of a kind the operator was not told to protect,
// or "" when it is declared or no operator has recorded its list.
func (a *auditor) undeclared(res schema.GroupVersionResource) string {
	if a.declared == nil {
		return ""
	}
	return protectedkinds.UndeclaredGap(a.declared, res)
}

func (a *auditor) namespaceLabels(ctx context.Context, ns string) (map[string]string, error) {
	if l, ok := a.nsLabels[ns]; ok {
		return l, nil
	}
	var n corev1.Namespace
	if err := a.kube.Get(ctx, client.ObjectKey{Name: ns}, &n); err != nil {
		return nil, err
	}
	a.nsLabels[ns] = n.Labels
	return n.Labels, nil
}

func selects(sel *metav1.LabelSelector, l map[string]string) bool {
	if sel == nil {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(l))
}

func enforcementOf(fr *locksv1.FencedResource) locksv1.EnforcementMode {
	if fr.Spec.Enforcement == "" {
		return locksv1.EnforcementShadow
	}
	return fr.Spec.Enforcement
}
