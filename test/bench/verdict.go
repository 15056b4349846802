package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// The rule for lines measured in repetitions: a tail (a p99, a ratio of two
// p99s) from one sample flips from run to run on a shared machine, so such a
// line is measured in repetitionCount interleaved repetitions and judged on
// all of them.
const (
	repetitionCount = 5
	// tailTolerance: a repetition beyond the limit by more than this factor
	// is an excess the PASS rule allows once.
	tailTolerance = 1.2
)

// limit is a target's bound: at most Value, or at least Value when AtLeast.
type limit struct {
	Value   float64 `json:"value"`
	AtLeast bool    `json:"at_least,omitempty"`
}

func atMost(v float64) limit  { return limit{Value: v} }
func atLeast(v float64) limit { return limit{Value: v, AtLeast: true} }

// within reports whether v meets the limit; a figure not measured does not.
func (l limit) within(v float64) bool {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return false
	}
	if l.AtLeast {
		return v >= l.Value
	}
	return v <= l.Value
}

// beyond reports whether v misses the limit by more than factor (1: at all).
func (l limit) beyond(v, factor float64) bool {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return true
	}
	if l.AtLeast {
		return v < l.Value/factor
	}
	return v > l.Value*factor
}

// verdict is PASS when v meets the limit, FAIL otherwise.
func (l limit) verdict(v float64) string {
	if l.within(v) {
		return verdictPass
	}
	return verdictFail
}

func (l limit) String() string {
	if l.AtLeast {
		return "≥ " + fmtF(l.Value)
	}
	return "≤ " + fmtF(l.Value)
}

// tailVerdict judges a line measured in repetitions: PASS when the median
// is within the limit and at most one repetition is beyond 1.2× the limit;
// FAIL when the median is beyond the limit and all repetitions but at most
// one (four of five) are beyond 1.2× it; INCONCLUSIVE otherwise, and when
// there are none (one noisy repetition decides nothing).
func tailVerdict(reps []float64, l limit) (median float64, verdict string) {
	if len(reps) == 0 {
		return math.NaN(), verdictInconclusive
	}
	median = medianOf(reps)
	far := 0
	for _, v := range reps {
		if l.beyond(v, tailTolerance) {
			far++
		}
	}
	switch {
	case l.within(median) && far <= 1:
		return median, verdictPass
	case !l.within(median) && far >= len(reps)-1:
		return median, verdictFail
	}
	return median, verdictInconclusive
}

// medianOf is the median (the mean of the middle two of an even count).
func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// repsString prints repetitions as "1.10, 1.22, …".
func repsString(reps []float64) string {
	parts := make([]string, len(reps))
	for i, v := range reps {
		parts[i] = fmtF(v)
	}
	return strings.Join(parts, ", ")
}

// judgeTail records a line measured in repetitions, judged by tailVerdict;
// its measured figure is the median. A line with no repetition measured
// has no median and FAILs (addTarget): the run did not measure it.
func (r *report) judgeTail(name, rule string, reps []float64, l limit, unit, detail string) {
	median, v := tailVerdict(reps, l)
	detail = strings.TrimSpace(fmt.Sprintf("repetitions %s. %s", repsString(reps), detail))
	r.addTarget(target{Name: name, Rule: rule, Measured: median, Limit: l, Unit: unit, Verdict: v, Repetitions: reps, Detail: detail})
}

// report records a ratio printed beside the targets and not judged (what
// users pay against raw Kubernetes primitives).
func (r *report) report(name, rule string, measured float64, detail string) {
	r.addTarget(target{Name: name, Rule: rule, Measured: measured, Unit: "×", Verdict: verdictReported, Detail: detail})
}

func (r *report) addTarget(t target) {
	if math.IsNaN(t.Measured) || math.IsInf(t.Measured, 0) {
		t.Measured = -1 // JSON has no NaN or infinity
		t.Detail = strings.TrimSpace(t.Detail + " (not measured: no samples)")
		if t.Verdict != verdictReported {
			t.Verdict = verdictFail
		}
	}
	t.Repetitions = slices.Clone(t.Repetitions) // the caller's figures stay as measured
	for i, v := range t.Repetitions {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Repetitions[i] = -1
		}
	}
	r.Targets = append(r.Targets, t)
}
