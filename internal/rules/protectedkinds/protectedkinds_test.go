package protectedkinds

import (
	"reflect"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestParse(t *testing.T) {
	widgets := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	cases := []struct {
		in      string
		want    []schema.GroupVersionResource
		wantErr string
	}{
		{in: "", want: nil},
		{in: "widgets.example.com/v1", want: []schema.GroupVersionResource{widgets}},
		{in: " widgets.example.com/v1 , secrets/v1 ,", want: []schema.GroupVersionResource{widgets, secrets}},
		{in: "widgets.example.com", wantErr: "no version"},
		{in: "widgets.example.com/", wantErr: "no version"},
		{in: "widgets.example.com/v1/scale", wantErr: "subresources"},
		{in: "*.example.com/v1", wantErr: "wildcards"},
		{in: "Widgets.example.com/v1", wantErr: "lower-case plural"},
		{in: "widgets.Example_com/v1", wantErr: "DNS subdomain"},
		{in: "lockgrants.locks.fencekeeper.dev/v1alpha1", wantErr: "own kinds"},
		{in: "configmaps/v1", wantErr: "always protected"},
		{in: "widgets.example.com/v1,widgets.example.com/v1", wantErr: "twice"},
	}
	for _, c := range cases {
		got, err := Parse(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("Parse(%q) error %v, want one containing %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
		if back := FormatList(got); len(got) > 0 && back != strings.Join(strings.Fields(strings.NewReplacer(",", " ").Replace(c.in)), ",") {
			t.Errorf("FormatList(%v) = %q, does not round-trip %q", got, back, c.in)
		}
	}
}

func TestConfigurationGaps(t *testing.T) {
	widgets := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
	configmaps := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	path := locksv1.ProtectedWebhookPath
	entry := func(name string, rules ...admissionregistrationv1.RuleWithOperations) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{Name: name, Rules: rules,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Path: &path}}}
	}
	cmRule := admissionregistrationv1.RuleWithOperations{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
	}
	noSub := Rule(widgets)
	noSub.Resources = []string{"widgets"}
	ignore := admissionregistrationv1.Ignore
	ignored := entry("vprotected", cmRule, Rule(widgets))
	ignored.FailurePolicy = &ignore
	other := "/validate-something-else"
	cfg := func(annotation *string, hooks ...admissionregistrationv1.ValidatingWebhook) *admissionregistrationv1.ValidatingWebhookConfiguration {
		c := &admissionregistrationv1.ValidatingWebhookConfiguration{Webhooks: hooks}
		c.Name = "fencekeeper-validating-webhook-configuration"
		if annotation != nil {
			c.Annotations = map[string]string{locksv1.AnnotationProtectedKinds: *annotation}
		}
		return c
	}
	declared, none := "widgets.example.com/v1", ""
	notProtected := entry("vlockgrant", Rule(widgets))
	notProtected.ClientConfig.Service.Path = &other
	cases := []struct {
		name string
		cfg  *admissionregistrationv1.ValidatingWebhookConfiguration
		res  schema.GroupVersionResource
		want []string // substrings, one per gap
	}{
		{"declared and covered", cfg(&declared, entry("vprotected", cmRule, Rule(widgets)), entry("vprotected-enrolled", cmRule, Rule(widgets))), widgets, nil},
		{"covered, no list recorded", cfg(nil, entry("vprotected", cmRule, Rule(widgets))), widgets, nil},
		{"ConfigMaps need no declaration", cfg(&none, entry("vprotected", cmRule)), configmaps, nil},
		{"not declared, rule left by hand", cfg(&none, entry("vprotected", cmRule, Rule(widgets))), widgets, []string{"not a declared protected kind"}},
		{"not covered", cfg(nil, entry("vprotected", cmRule)), widgets, []string{"webhook vprotected does not cover widgets.example.com (fix: declare it, --protected-kinds=widgets.example.com/v1"}},
		{"one entry of two misses it", cfg(nil, entry("vprotected", cmRule, Rule(widgets)), entry("vprotected-enrolled", cmRule)), widgets, []string{"webhook vprotected-enrolled does not cover"}},
		{"subresources not covered", cfg(nil, entry("vprotected", cmRule, noSub)), widgets, []string{"does not cover the subresources of widgets.example.com"}},
		{"fails open", cfg(nil, ignored), widgets, []string{"failurePolicy Ignore"}},
		{"no protected entry", cfg(nil, notProtected), widgets, []string{"has no protected-object webhook entry"}},
	}
	for _, c := range cases {
		got := ConfigurationGaps(c.cfg, c.res)
		if len(got) != len(c.want) {
			t.Errorf("%s: gaps %q, want %d containing %q", c.name, got, len(c.want), c.want)
			continue
		}
		for i := range got {
			if !strings.Contains(got[i], c.want[i]) {
				t.Errorf("%s: gap %q, want one containing %q", c.name, got[i], c.want[i])
			}
		}
	}
}
