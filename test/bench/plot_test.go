package main

import (
	"encoding/xml"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The plots are well-formed SVG with one line per curve, and a plot with
// no samples says so instead of dividing by nothing.
func TestPlotSVG(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	p := plot{title: "a & b", xLabel: "ms", yLabel: "fraction", yMax: 1,
		curves: []curve{cdfCurve("one", ms(3, 4, 40)), cdfCurve("two", ms(5, 7, 300))}}
	svg := string(p.svg())
	if err := xml.Unmarshal([]byte(svg), new(struct{})); err != nil {
		t.Fatalf("not XML: %v\n%s", err, svg)
	}
	if n := strings.Count(svg, "<polyline"); n != 2 {
		t.Errorf("%d curves drawn, want 2", n)
	}
	// The axis's ticks below the smallest sample keep their own places.
	ticks := regexp.MustCompile(`<text x="([0-9.]+)" y="[0-9.]+" text-anchor="middle">[0-9.]+</text>`).FindAllStringSubmatch(svg, -1)
	last := -1.0
	for _, m := range ticks {
		x, _ := strconv.ParseFloat(m[1], 64)
		if x <= last {
			t.Fatalf("ticks not in order along the axis: %v", ticks)
		}
		last = x
	}
	if c := cdfCurve("x", ms(3, 1, 2)); c.xs[0] != 1 || c.ys[2] != 1 {
		t.Errorf("cdf %v %v: want sorted times ending at fraction 1", c.xs, c.ys)
	}
	empty := string(plot{title: "none"}.svg())
	if !strings.Contains(empty, "no samples") {
		t.Errorf("empty plot: %s", empty)
	}
}
