package operator

import (
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/protectedkinds"
)

// webhookShape is config/webhook/manifests.yaml, generated from the
// webhooks' markers and copied here by make manifests: the webhooks this
// version of the operator serves, with their rules, selectors and policies.
//
//go:embed webhooks.yaml
var webhookShape []byte

// WebhookShapeGeneration numbers the shape of the webhook configuration this
// version of the operator keeps (webhooks.yaml and what the operator adds:
// the declared kinds' rules, the exempt namespaces). Raise it with every
// change of that shape. The leader writes it into the configuration
// (locksv1.AnnotationWebhookShapeGeneration) with its shape; an operator of
// a lower generation leaves a configuration of a higher one alone, so that
// during a rollout the old leader never puts its shape back over the new
// one. A configuration without the annotation is generation 0: installed by
// a manifest or chart, or kept by an operator older than generations.
const WebhookShapeGeneration = 1

// ShapeGeneration reads the generation a configuration names: 0 when it
// names none, and 0 with an error when the value is not a generation (it is
// then rewritten like an older shape).
func ShapeGeneration(cfg *admissionregistrationv1.ValidatingWebhookConfiguration) (int, error) {
	v, ok := cfg.Annotations[locksv1.AnnotationWebhookShapeGeneration]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("annotation %s=%q is not a generation (a number >= 0)", locksv1.AnnotationWebhookShapeGeneration, v)
	}
	return n, nil
}

// ShapeWebhooks are this version's webhooks as generated, pointing at the
// generated Service (config/webhook), without a caBundle.
func ShapeWebhooks() ([]admissionregistrationv1.ValidatingWebhook, error) {
	var cfg admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(webhookShape, &cfg); err != nil {
		return nil, fmt.Errorf("the operator's embedded webhook shape: %w", err)
	}
	if len(cfg.Webhooks) == 0 {
		return nil, errors.New("the operator's embedded webhook shape has no webhooks (run make manifests)")
	}
	return cfg.Webhooks, nil
}

// PointedLike returns hooks with each clientConfig pointing where the live
// configuration points: a live webhook of the same name keeps its
// clientConfig (the installer decides the Service, or the URL, and the
// port); a webhook the live configuration lacks (new in this shape) goes to
// the same server as the first live one, at its own path. The caBundle is
// left out: WebhookDrift and the certificate owner decide it.
func PointedLike(hooks, live []admissionregistrationv1.ValidatingWebhook) ([]admissionregistrationv1.ValidatingWebhook, error) {
	if len(live) == 0 {
		return nil, errors.New("the live webhook configuration has no webhooks to learn the webhook server's address from")
	}
	byName := map[string]*admissionregistrationv1.ValidatingWebhook{}
	for i := range live {
		byName[live[i].Name] = &live[i]
	}
	out := make([]admissionregistrationv1.ValidatingWebhook, len(hooks))
	for i := range hooks {
		out[i] = *hooks[i].DeepCopy()
		path := ""
		if s := hooks[i].ClientConfig.Service; s != nil && s.Path != nil {
			path = *s.Path
		}
		if w, ok := byName[hooks[i].Name]; ok {
			out[i].ClientConfig = *w.ClientConfig.DeepCopy()
		} else {
			cc, err := atPath(live[0].ClientConfig, path)
			if err != nil {
				return nil, fmt.Errorf("webhook %s: %w", hooks[i].Name, err)
			}
			out[i].ClientConfig = cc
		}
		out[i].ClientConfig.CABundle = nil
	}
	return out, nil
}

// atPath is cc (a Service or a URL) with its path replaced.
func atPath(cc admissionregistrationv1.WebhookClientConfig, path string) (admissionregistrationv1.WebhookClientConfig, error) {
	out := *cc.DeepCopy()
	switch {
	case out.Service != nil:
		out.Service.Path = &path
	case out.URL != nil:
		u, err := url.Parse(*out.URL)
		if err != nil {
			return out, fmt.Errorf("live webhook URL %q: %w", *out.URL, err)
		}
		u.Path = path
		s := u.String()
		out.URL = &s
	default:
		return out, errors.New("the live webhook has neither a service nor a URL")
	}
	return out, nil
}

// WithExemptions returns hooks with the protected entries' namespaceSelector
// excluding names (`kubernetes.io/metadata.name NotIn names`): a write in an
// exempt namespace never waits on the acceptance webhook, enrolled or not,
// so a dead operator never blocks it. Other entries are left as they are:
// the FencedResource webhook has to see an entry created in an exempt
// namespace to refuse it, and LockGrants are fencekeeper's own objects.
func WithExemptions(hooks []admissionregistrationv1.ValidatingWebhook, names []string) []admissionregistrationv1.ValidatingWebhook {
	out := make([]admissionregistrationv1.ValidatingWebhook, len(hooks))
	for i := range hooks {
		out[i] = *hooks[i].DeepCopy()
		if !protectedkinds.IsProtectedEntry(&out[i]) {
			continue
		}
		if out[i].NamespaceSelector == nil {
			out[i].NamespaceSelector = &metav1.LabelSelector{}
		}
		sel := out[i].NamespaceSelector
		found := false
		for j := range sel.MatchExpressions {
			e := &sel.MatchExpressions[j]
			if e.Key == corev1.LabelMetadataName && e.Operator == metav1.LabelSelectorOpNotIn {
				e.Values = append([]string(nil), names...)
				found = true
			}
		}
		if !found {
			sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{
				Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: append([]string(nil), names...)})
		}
	}
	return out
}
