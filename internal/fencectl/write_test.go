package fencectl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// TestOutcomeUnknown: a write whose outcome is unknown is neither success
// (0) nor a refusal (1), in text and in -o json.
func TestOutcomeUnknown(t *testing.T) {
	unknown := fmt.Errorf("%w: ConfigMap/batch segment 2 under fence 1: it may still land", lockclient.ErrMutationUnknown)
	for _, output := range []string{"", "json"} {
		var out, errOut bytes.Buffer
		f, err := parseFormat(output, "", false)
		if err != nil {
			t.Fatal(err)
		}
		o := &options{stdout: &out, stderr: &errOut, format: f}
		err = o.outcomeUnknown(writeResult{Object: "ConfigMap/batch", Fence: 1, Operation: "op"}, unknown)
		var exit exitError
		if !errors.As(err, &exit) || exit.code != exitUnknown {
			t.Fatalf("-o %q: got %v, want exit code %d", output, err, exitUnknown)
		}
		if output == "" {
			if s := errOut.String(); !strings.Contains(s, "outcome unknown") || !strings.Contains(s, "kubectl fence receipts") {
				t.Errorf("text: %q says neither that the outcome is unknown nor how to decide it", s)
			}
			continue
		}
		var res writeResult
		if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.Verdict != "MUTATION_UNKNOWN" || !strings.Contains(res.Message, "may still land") {
			t.Errorf("-o json: %s (%v)", out.String(), err)
		}
	}
}
