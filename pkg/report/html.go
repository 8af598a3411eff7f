package report

import (
	"fmt"
	"html/template"
	"io"
	"sort"
	"strings"
	"time"
)

// bar is one bar of a chart: a rate with its interval.
type bar struct {
	label string
	rate  Rate
}

const (
	chartWidth = 720
	labelWidth = 200
	rowHeight  = 24
)

// Charts style themselves with SVG attributes, not the page's CSS, so one saved or copied
// out of the page looks the same.

// rateChart draws rates as horizontal bars with their intervals as whiskers, in SVG.
func rateChart(title string, bars []bar) template.HTML {
	if len(bars) == 0 {
		return ""
	}
	plot := float64(chartWidth - labelWidth - 90)
	height := 30 + rowHeight*len(bars) + 24
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" role="img" width="%d" height="%d" viewBox="0 0 %d %d">`, chartWidth, height, chartWidth, height)
	fmt.Fprintf(&b, `<title>%s</title>`, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<text x="0" y="16" font-family="sans-serif" font-size="13" font-weight="600">%s</text>`, template.HTMLEscapeString(title))
	x0 := float64(labelWidth)
	for _, tick := range []float64{0, 0.25, 0.5, 0.75, 1} {
		x := x0 + tick*plot
		fmt.Fprintf(&b, `<line x1="%.1f" y1="26" x2="%.1f" y2="%d" stroke="#d0d7de" stroke-width="1"/>`, x, x, height-20)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-family="sans-serif" font-size="11" text-anchor="middle">%.0f %%</text>`, x, height-6, tick*100)
	}
	for i, br := range bars {
		y := 30 + i*rowHeight
		label := br.label
		if len(label) > 30 {
			label = label[:29] + "…"
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-family="sans-serif" font-size="11" text-anchor="end">%s</text>`, labelWidth-6, y+15, template.HTMLEscapeString(label))
		if br.rate.Trials == 0 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-family="sans-serif" font-size="11">no episodes</text>`, x0+4, y+15)
			continue
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#4c8bf5"><title>%s: %s of %d</title></rect>`,
			x0, y+4, br.rate.Rate*plot, rowHeight-8, template.HTMLEscapeString(br.label), pct(br.rate), br.rate.Trials)
		lo, hi, mid := x0+br.rate.Low*plot, x0+br.rate.High*plot, y+rowHeight/2
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#1b1f24" stroke-width="1.5"/>`, lo, mid, hi, mid)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#1b1f24" stroke-width="1.5"/>`, lo, mid-5, lo, mid+5)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#1b1f24" stroke-width="1.5"/>`, hi, mid-5, hi, mid+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-family="sans-serif" font-size="11">%.1f %% (n=%d)</text>`, x0+plot+6, y+15, 100*br.rate.Rate, br.rate.Trials)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// curveChart draws success per batch, in order, as a line with the interval as a band.
func curveChart(title string, points []bar) template.HTML {
	if len(points) < 2 {
		return ""
	}
	const w, h, left, top, bottom = chartWidth, 260, 50, 26, 30
	plotW, plotH := float64(w-left-20), float64(h-top-bottom)
	x := func(i int) float64 { return left + plotW*float64(i)/float64(len(points)-1) }
	y := func(v float64) float64 { return top + plotH*(1-v) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" role="img" width="%d" height="%d" viewBox="0 0 %d %d">`, w, h, w, h)
	fmt.Fprintf(&b, `<title>%s</title><text x="0" y="16" font-family="sans-serif" font-size="13" font-weight="600">%s</text>`, template.HTMLEscapeString(title), template.HTMLEscapeString(title))
	for _, tick := range []float64{0, 0.5, 1} {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#d0d7de" stroke-width="1"/><text x="%d" y="%.1f" font-family="sans-serif" font-size="11" text-anchor="end">%.0f %%</text>`,
			left, y(tick), w-20, y(tick), left-4, y(tick)+4, tick*100)
	}
	var band, line strings.Builder
	for i, p := range points {
		fmt.Fprintf(&band, "%.1f,%.1f ", x(i), y(p.rate.High))
	}
	for i := len(points) - 1; i >= 0; i-- {
		fmt.Fprintf(&band, "%.1f,%.1f ", x(i), y(points[i].rate.Low))
	}
	for i, p := range points {
		fmt.Fprintf(&line, "%.1f,%.1f ", x(i), y(p.rate.Rate))
	}
	fmt.Fprintf(&b, `<polygon points="%s" fill="#4c8bf5" fill-opacity="0.2"/><polyline points="%s" fill="none" stroke="#4c8bf5" stroke-width="2"/>`, band.String(), line.String())
	for i, p := range points {
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="#1f5fbf"><title>%s: %s of %d</title></circle>`,
			x(i), y(p.rate.Rate), template.HTMLEscapeString(p.label), pct(p.rate), p.rate.Trials)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-family="sans-serif" font-size="11">%s</text><text x="%d" y="%d" font-family="sans-serif" font-size="11" text-anchor="end">%s</text>`,
		left, h-8, template.HTMLEscapeString(points[0].label), w-20, h-8, template.HTMLEscapeString(points[len(points)-1].label))
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// batchCurve is a curriculum's success per batch, in stage and batch order.
func batchCurve(r *Report) []bar {
	var gs []Group
	for _, g := range r.ByRun {
		if g.Run != nil && g.Run.CurriculumPrefix != "" {
			gs = append(gs, g)
		}
	}
	sort.SliceStable(gs, func(i, j int) bool {
		a, b := gs[i].Run, gs[j].Run
		if a.Stage != b.Stage {
			return a.Stage < b.Stage
		}
		return a.Batch < b.Batch
	})
	out := make([]bar, len(gs))
	for i, g := range gs {
		out[i] = bar{fmt.Sprintf("stage %d batch %d", g.Run.Stage, g.Run.Batch), g.Success}
	}
	return out
}

type htmlSection struct {
	Title, Note string
	Head        []string
	Rows        [][]string
}

type htmlPage struct {
	Title     string
	Generated string
	Database  string
	Charts    []template.HTML
	Sections  []htmlSection
}

var page = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gauntlet report: {{.Title}}</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;color:#1b1f24;padding:0 16px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;white-space:nowrap}th{background:#f6f8fa}
.note{color:#57606a;margin:4px 0}.charts svg{display:block;margin:12px 0}
</style></head><body>
<h1>Compatibility report: {{.Title}}</h1>
<p class="note">database {{.Database}}, generated {{.Generated}}. Success rates exclude infra errors; intervals are Wilson's at 95 %; percentiles are exact. Every number is the result of the SQL in docs/querying.md.</p>
<div class="charts">{{range .Charts}}{{.}}{{end}}</div>
{{range .Sections}}<h2>{{.Title}}</h2>{{if .Note}}<p class="note">{{.Note}}</p>{{end}}
<table><thead><tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr></thead><tbody>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</tbody></table>
{{end}}</body></html>
`))

func writeHTML(w io.Writer, r *Report) error {
	p := htmlPage{Title: r.Title, Generated: r.GeneratedAt.Format(time.RFC3339), Database: r.Database}
	if curve := batchCurve(r); len(curve) > 1 {
		p.Charts = append(p.Charts, curveChart("Success per batch (band: 95 % interval)", curve))
	}
	var groups []bar
	switch {
	case len(r.ByStage) > 0:
		for _, g := range r.ByStage {
			groups = append(groups, bar{"stage " + g.Key, g.Success})
		}
		p.Charts = append(p.Charts, rateChart("Success by stage", groups))
	case len(r.ByRun) > 1:
		for _, g := range r.ByRun {
			label := g.Key
			if g.Run != nil && g.Run.Label != "" {
				label += " " + g.Run.Label
			}
			groups = append(groups, bar{label, g.Success})
		}
		p.Charts = append(p.Charts, rateChart("Success by run", groups))
	}
	var pol []bar
	for _, g := range r.ByPolicy {
		pol = append(pol, bar{g.Key, g.Success})
	}
	p.Charts = append(p.Charts, rateChart("Success by policy", pol))
	faults := []bar{{"(no fault)", r.Unfaulted}}
	for _, f := range r.Faults {
		faults = append(faults, bar{f.Kind, f.Met})
	}
	p.Charts = append(p.Charts, rateChart("Success of episodes that met each fault kind", faults))
	var first []bar
	for _, f := range r.Faults {
		if f.First.Trials > 0 {
			first = append(first, bar{f.Kind, f.First})
		}
	}
	p.Charts = append(p.Charts, rateChart("Success by first fault met", first))
	for _, s := range sections(r) {
		p.Sections = append(p.Sections, htmlSection{Title: s.title, Note: s.note, Head: s.head, Rows: s.rows})
	}
	return page.Execute(w, p)
}
