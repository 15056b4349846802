package main

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

func TestTailVerdict(t *testing.T) {
	for name, c := range map[string]struct {
		reps []float64
		l    limit
		want string
	}{
		"all within":                      {[]float64{1.0, 1.1, 1.05, 1.2, 0.9}, atMost(1.3), verdictPass},
		"one noisy repetition":            {[]float64{1.0, 1.1, 3.0, 1.2, 0.9}, atMost(1.3), verdictPass},
		"two noisy repetitions":           {[]float64{1.0, 1.7, 3.0, 1.2, 0.9}, atMost(1.3), verdictInconclusive},
		"median over, three far over":     {[]float64{1.4, 1.7, 3.0, 1.6, 0.9}, atMost(1.3), verdictInconclusive},
		"median over, four far over":      {[]float64{1.4, 1.7, 3.0, 1.6, 1.9}, atMost(1.3), verdictFail},
		"median over, none far over":      {[]float64{1.4, 1.4, 1.4, 1.4, 1.4}, atMost(1.3), verdictInconclusive},
		"no repetitions":                  {nil, atMost(1.3), verdictInconclusive},
		"a repetition without a sample":   {[]float64{1.0, 1.0, 1.0, 1.0, math.Inf(1)}, atMost(1.3), verdictPass},
		"at least: all within":            {[]float64{0.95, 0.9, 1.0, 0.92, 0.91}, atLeast(0.9), verdictPass},
		"at least: one far under":         {[]float64{0.95, 0.5, 1.0, 0.92, 0.91}, atLeast(0.9), verdictPass},
		"at least: under, not far":        {[]float64{0.85, 0.8, 0.86, 0.88, 0.8}, atLeast(0.9), verdictInconclusive},
		"at least: median and four far":   {[]float64{0.6, 0.7, 0.95, 0.5, 0.7}, atLeast(0.9), verdictFail},
		"at least: four without a figure": {[]float64{math.NaN(), math.NaN(), math.NaN(), math.NaN(), 1}, atLeast(0.9), verdictFail},
	} {
		if _, got := tailVerdict(c.reps, c.l); got != c.want {
			t.Errorf("%s: %s, want %s", name, got, c.want)
		}
	}
}

// A line judged on no figure is a FAIL, never a PASS or INCONCLUSIVE; a
// reported one stays reported.
func TestTargetWithoutFigure(t *testing.T) {
	r := &report{}
	r.judgeTail("tail", "", nil, atMost(1), "×", "")
	r.judge("one", "", math.NaN(), atMost(1), "", "")
	r.report("shown", "", math.Inf(1), "")
	want := []string{verdictFail, verdictFail, verdictReported}
	for i, tg := range r.Targets {
		if tg.Verdict != want[i] || tg.Measured != -1 {
			t.Errorf("%s: %s measured %v, want %s measured -1", tg.Name, tg.Verdict, tg.Measured, want[i])
		}
	}
	if r.allPass() {
		t.Error("allPass with a FAIL")
	}
}

// The results file is written whatever figure was not measured: JSON has
// no NaN or infinity, and they read -1; times keep their value.
func TestResultsWithoutFigures(t *testing.T) {
	at := time.Date(2026, 12, 5, 1, 2, 3, 0, time.UTC)
	r := &report{Env: envInfo{Start: at}, Throughput: &throughputResult{OperatorCPUShare: math.NaN(), FloorOverRawContended: math.Inf(1),
		OverFloorContended: []float64{1, math.NaN()}, Runs: []tputRun{{CPUPerCycle: map[string]float64{"x": math.Inf(-1)}}}}}
	b, err := marshalFinite(r)
	if err != nil {
		t.Fatal(err)
	}
	var back report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	tp := back.Throughput
	if tp.OperatorCPUShare != -1 || tp.FloorOverRawContended != -1 || tp.OverFloorContended[1] != -1 || tp.OverFloorContended[0] != 1 ||
		tp.Runs[0].CPUPerCycle["x"] != -1 || !back.Env.Start.Equal(at) {
		t.Errorf("written as %s", b)
	}
	if !math.IsNaN(r.Throughput.OperatorCPUShare) {
		t.Error("the report itself was changed")
	}
}

// A figure in an embedded unexported struct would be written as zero: the
// copy refuses such a type instead.
func TestResultsRefuseAnEmbeddedUnexportedStruct(t *testing.T) {
	type inner struct{ P99 float64 }
	type outer struct{ inner }
	defer func() {
		if recover() == nil {
			t.Error("marshalFinite wrote an embedded unexported struct")
		}
	}()
	_, _ = marshalFinite(outer{inner{P99: 1}})
}
