package main

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// fakeLoop is a handoffLoop whose steps take 1 ms, 2 ms, … and log their
// order (its name, with * when the step was to be recorded); failAt fails
// that step (1-based) and unsampled ones are not timed.
type fakeLoop struct {
	name      string
	log       *[]string
	steps     int
	failAt    int
	unsampled map[int]bool
	closed    bool
}

func (f *fakeLoop) step(_ context.Context, record bool) (time.Duration, bool, error) {
	f.steps++
	entry := f.name
	if record {
		entry += "*"
	}
	*f.log = append(*f.log, entry)
	if f.steps == f.failAt {
		return 0, false, errors.New("step failed")
	}
	return time.Duration(f.steps) * time.Millisecond, !f.unsampled[f.steps], nil
}

func (f *fakeLoop) close(context.Context) error { f.closed = true; return nil }

func millis(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestRunHandoffsKeepsTimedStepsAfterTheWarmup(t *testing.T) {
	var log []string
	l := &fakeLoop{name: "a", log: &log, unsampled: map[int]bool{4: true}}
	got, err := runHandoffs(context.Background(), l, 2, 3)
	if err != nil || !slices.Equal(got, millis(3, 5)) || !l.closed {
		t.Errorf("runHandoffs = %v, %v (closed %v); want [3ms 5ms], nil, closed", got, err, l.closed)
	}
	if want := []string{"a", "a", "a*", "a*", "a*"}; !slices.Equal(log, want) {
		t.Errorf("steps %v, want %v (the warmup's not recorded)", log, want)
	}
	l = &fakeLoop{name: "a", log: &log, failAt: 2}
	if got, err := runHandoffs(context.Background(), l, 0, 3); err == nil || got != nil || !l.closed {
		t.Errorf("a failed step: runHandoffs = %v, %v (closed %v); want nil, the error, closed", got, err, l.closed)
	}
}

func TestAlternateStepsAlternatesWhoGoesFirst(t *testing.T) {
	var log []string
	fl, rl := &fakeLoop{name: "fk", log: &log}, &fakeLoop{name: "raw", log: &log, unsampled: map[int]bool{3: true}}
	fk, raw, err := alternateSteps(context.Background(), fl, rl, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"fk", "raw", "raw*", "fk*", "fk*", "raw*", "raw*", "fk*"}; !slices.Equal(log, want) {
		t.Errorf("order %v, want %v", log, want)
	}
	if !slices.Equal(fk, millis(2, 3, 4)) || !slices.Equal(raw, millis(2, 4)) {
		t.Errorf("fencekeeper %v, raw %v; want [2ms 3ms 4ms] and [2ms 4ms]", fk, raw)
	}
	log = nil
	fl, rl = &fakeLoop{name: "fk", log: &log}, &fakeLoop{name: "raw", log: &log, failAt: 2}
	if _, _, err := alternateSteps(context.Background(), fl, rl, 0, 3); err == nil || err.Error() != "raw: step failed" {
		t.Errorf("a failed raw step: err = %v, want %q", err, "raw: step failed")
	}
	if want := []string{"fk*", "raw*", "raw*"}; !slices.Equal(log, want) {
		t.Errorf("after a failed step: order %v, want %v (nothing stepped after it)", log, want)
	}
}
