package operator

import (
	"reflect"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/fencekeeper/fencekeeper/internal/rules/protectedkinds"
)

func TestWithProtectedKinds(t *testing.T) {
	widgets := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
	hooks := installedHooks() // vlockgrant, then vprotected with configmaps and invoicebatches rules
	lockgrantPath := "/validate-locks-fencekeeper-dev-v1alpha1-lockgrant"
	hooks[0].ClientConfig.Service = hooks[0].ClientConfig.Service.DeepCopy()
	hooks[0].ClientConfig.Service.Path = &lockgrantPath
	got := WithProtectedKinds(hooks, []schema.GroupVersionResource{widgets})
	if !reflect.DeepEqual(got[0], hooks[0]) {
		t.Errorf("a webhook that is not a protected entry changed: %v", got[0].Rules)
	}
	want := []admissionregistrationv1.RuleWithOperations{hooks[1].Rules[0], protectedkinds.Rule(widgets)}
	if !reflect.DeepEqual(got[1].Rules, want) {
		t.Errorf("protected entry rules = %v, want the ConfigMaps rule then widgets (the undeclared invoicebatches rule dropped): %v", got[1].Rules, want)
	}
	if r := protectedkinds.Rule(widgets); !reflect.DeepEqual(r.Resources, []string{"widgets", "widgets/*"}) || len(r.Operations) != 3 {
		t.Errorf("protectedkinds.Rule = %v, want widgets and every subresource for CREATE, UPDATE, DELETE", r)
	}
	// Nothing declared: only ConfigMaps stay.
	if got := WithProtectedKinds(hooks, nil); len(got[1].Rules) != 1 || got[1].Rules[0].Resources[0] != "configmaps" {
		t.Errorf("with no kinds declared the protected entry keeps %v, want the ConfigMaps rule only", got[1].Rules)
	}
	// A restore names what it puts back and what it drops.
	_, drift := WebhookDrift(WithProtectedKinds(hooks, nil), got, false)
	if len(drift) != 1 || !strings.Contains(drift[0], "removed undeclared widgets.example.com/v1") {
		t.Errorf("drift = %v, want the undeclared widgets rule named", drift)
	}
}
