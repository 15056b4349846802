package main

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// The bench draws what people would rather look at than read: latency
// distributions as cumulative curves on a logarithmic time axis, where the
// tails are visible, and the scale curves. Plain SVG, no dependency.

// curve is one named line of a plot: points (x, y), drawn in order.
type curve struct {
	name   string
	xs, ys []float64
}

// cdfCurve is the empirical distribution of samples: the fraction of them
// at or under each sample, in milliseconds.
func cdfCurve(name string, samples []time.Duration) curve {
	s := slices.Clone(samples)
	slices.Sort(s)
	c := curve{name: name}
	for i, d := range s {
		c.xs = append(c.xs, float64(d)/float64(time.Millisecond))
		c.ys = append(c.ys, float64(i+1)/float64(len(s)))
	}
	return c
}

// plot is one chart: logarithmic x axis, linear y axis from 0.
type plot struct {
	title, xLabel, yLabel string
	curves                []curve
	yMax                  float64 // 0: from the data
}

var plotColours = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}

const (
	plotW, plotH                         = 720, 420
	plotLeft, plotRight, plotTop         = 70, 200, 40
	plotBottom                           = 50
	plotInnerW, plotInnerH       float64 = plotW - plotLeft - plotRight, plotH - plotTop - plotBottom
)

// svg renders the plot.
func (p plot) svg() []byte {
	xMin, xMax, yMax := math.Inf(1), math.Inf(-1), p.yMax
	for _, c := range p.curves {
		for i, x := range c.xs {
			if x > 0 {
				xMin, xMax = min(xMin, x), max(xMax, x)
			}
			if p.yMax == 0 {
				yMax = max(yMax, c.ys[i])
			}
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="22" font-size="15">%s</text>`+"\n", plotLeft, html.EscapeString(p.title))
	if math.IsInf(xMin, 0) || yMax <= 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d">no samples</text></svg>`+"\n", plotLeft, plotTop+40)
		return b.Bytes()
	}
	lo, hi := math.Floor(math.Log10(xMin)), math.Ceil(math.Log10(xMax))
	if hi == lo {
		hi++
	}
	px := func(x float64) float64 {
		return plotLeft + (math.Log10(max(x, math.Pow(10, lo)))-lo)/(hi-lo)*plotInnerW
	}
	py := func(y float64) float64 { return plotTop + plotInnerH - y/yMax*plotInnerH }
	// Grid: 1, 2 and 5 of each decade; five horizontal lines.
	for d := lo; d <= hi; d++ {
		for _, m := range []float64{1, 2, 5} {
			x := m * math.Pow(10, d)
			if math.Log10(x) > hi+1e-9 {
				continue
			}
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n",
				px(x), plotTop, px(x), plotTop+plotInnerH, px(x), plotTop+plotInnerH+16, fmtF(x))
		}
	}
	for i := 0; i <= 5; i++ {
		y := yMax * float64(i) / 5
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
			plotLeft, py(y), plotLeft+plotInnerW, py(y), plotLeft-6, py(y)+4, fmtF(y))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", plotLeft+plotInnerW/2, plotH-10, html.EscapeString(p.xLabel))
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n", plotTop+plotInnerH/2, plotTop+plotInnerH/2, html.EscapeString(p.yLabel))
	for i, c := range p.curves {
		colour := plotColours[i%len(plotColours)]
		var pts bytes.Buffer
		for j := range c.xs {
			fmt.Fprintf(&pts, "%.1f,%.1f ", px(c.xs[j]), py(c.ys[j]))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colour, pts.String())
		ly := plotTop + 10 + 20*i
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="3"/><text x="%.1f" y="%d">%s</text>`+"\n",
			plotLeft+plotInnerW+12, ly, plotLeft+plotInnerW+32, ly, colour, plotLeft+plotInnerW+38, ly+4, html.EscapeString(c.name))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// writePlots writes the run's plots as SVG files into dir and returns
// their paths.
func (r *report) writePlots(dir string) ([]string, error) {
	var plots []struct {
		file string
		p    plot
	}
	add := func(file string, p plot) {
		plots = append(plots, struct {
			file string
			p    plot
		}{file, p})
	}
	if h := r.Handoff; h != nil && h.samples != nil {
		add("handoff.svg", plot{title: "Release handoff: release → next holder", xLabel: "ms (log)", yLabel: "fraction of handoffs at or under", yMax: 1,
			curves: []curve{cdfCurve("fencekeeper", h.samples.fencekeeper), cdfCurve("contract floor", h.samples.floor),
				cdfCurve("one-write floor", h.samples.oneWrite), cdfCurve("raw Lease", h.samples.raw)}})
	}
	if w := r.Webhook; w != nil && len(w.samples) > 0 {
		var cs []curve
		for _, s := range w.samples {
			cs = append(cs, cdfCurve(fmt.Sprintf("protected @%g/s", s.rate), s.protected), cdfCurve(fmt.Sprintf("unprotected @%g/s", s.rate), s.unprotected))
		}
		add("protected-write.svg", plot{title: "ConfigMap update latency, protected and unprotected", xLabel: "ms (log)", yLabel: "fraction of updates at or under", yMax: 1, curves: cs})
	}
	if s := r.Scale; s != nil && len(s.Sizes) > 0 {
		var p99 [4]curve
		rss := curve{name: "operator peak RSS"}
		for i, name := range []string{"fencekeeper handoff", "raw Lease handoff", "protected update", "unprotected update"} {
			p99[i].name = name
		}
		for _, x := range s.Sizes {
			n := float64(x.Resources)
			for i, d := range []dist{x.Handoff, x.RawHandoff, x.Protected, x.Unprotected} {
				p99[i].xs, p99[i].ys = append(p99[i].xs, n), append(p99[i].ys, d.P99)
			}
			rss.xs, rss.ys = append(rss.xs, n), append(rss.ys, x.OperatorPeakMiB)
		}
		add("scale-p99.svg", plot{title: "p99 against the number of FencedResources", xLabel: "FencedResources (log)", yLabel: "p99 ms", curves: p99[:]})
		add("scale-rss.svg", plot{title: "Operator memory against the number of FencedResources", xLabel: "FencedResources (log)", yLabel: "MiB", curves: []curve{rss}})
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range plots {
		path := filepath.Join(dir, p.file)
		if err := os.WriteFile(path, p.p.svg(), 0o644); err != nil {
			return out, err
		}
		out = append(out, path)
	}
	return out, nil
}
