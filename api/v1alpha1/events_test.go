package v1alpha1

import (
	"regexp"
	"testing"
)

// Kubernetes Event reasons are CamelCase; verdict codes go in the note.
func TestEventReasonsAreCamelCase(t *testing.T) {
	camel := regexp.MustCompile(`^[A-Z][a-z]+(?:[A-Z][a-z]*|ID)*$`)
	seen := map[string]bool{}
	for _, r := range EventReasons {
		if !camel.MatchString(r) {
			t.Errorf("Event reason %q is not CamelCase", r)
		}
		if seen[r] {
			t.Errorf("Event reason %q listed twice", r)
		}
		seen[r] = true
	}
}
