package reports

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/url"
	"strings"
)

// table is a table of the page; a table without Head is a two-column list
// of names and values.
type table struct {
	Caption string
	Head    []string
	Rows    [][]string
}

// pageChart is a chart's place on the page.
type pageChart struct {
	ID     string
	Height int
	Wide   bool
}

// page is what the template renders.
type page struct {
	Title     string
	Notes     []string
	Tables    []table
	Charts    []pageChart
	CSP       string
	Script    template.JS // inline ECharts, or empty with ScriptURL
	ScriptURL string
	Options   template.JS // JSON array of {id, option}, HTML-safe
	Init      template.JS
}

var pageTpl = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{{.CSP}}">
<title>{{.Title}}</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;max-width:1500px;padding:0 1em;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse;font-size:0.9em}
td,th{border:1px solid #ccc;padding:0.25em 0.6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}
table.kv td:first-child{background:#f7f7f7;font-weight:600;white-space:nowrap}
.note{color:#555;font-size:0.9em}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(620px,1fr));gap:1em;margin-top:1em}
.chart{height:400px;border:1px solid #e3e3e3}
.chart.wide{grid-column:1/-1}
.chart.missing{height:auto;padding:1em;color:#a00}
</style>
{{if .ScriptURL}}<script src="{{.ScriptURL}}"></script>{{else}}<script>{{.Script}}</script>{{end}}
</head>
<body>
<h1>{{.Title}}</h1>
{{range .Notes}}<p class="note">{{.}}</p>
{{end}}
{{- range .Tables}}<h2>{{.Caption}}</h2>
<table{{if not .Head}} class="kv"{{end}}>{{if .Head}}<thead><tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr></thead>{{end}}<tbody>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</tbody></table>
{{end}}
<div class="charts">
{{range .Charts}}<div class="chart{{if .Wide}} wide{{end}}" id="{{.ID}}" style="height:{{.Height}}px"></div>
{{end}}</div>
<script type="application/json" id="report-options">{{.Options}}</script>
<script>{{.Init}}</script>
</body>
</html>
`))

// initJS draws every chart of the page from the JSON in #report-options.
const initJS = `(function () {
  "use strict";
  var specs = JSON.parse(document.getElementById("report-options").textContent);
  if (typeof echarts === "undefined") {
    specs.forEach(function (s) {
      var el = document.getElementById(s.id);
      el.className += " missing";
      el.textContent = "This chart needs the ECharts script, which did not load; regenerate the report with the script inlined (the default) or with a reachable -report-assets URL.";
    });
    return;
  }
  var all = [];
  specs.forEach(function (s) {
    var c = echarts.init(document.getElementById(s.id), null, {renderer: "canvas"});
    c.setOption(s.option);
    all.push(c);
  });
  window.addEventListener("resize", function () { all.forEach(function (c) { c.resize(); }); });
})();`

// checkAssetsURL checks a -report-assets URL: an http(s) or file URL, or a
// relative path, with nothing that could end the CSP or the attribute.
func checkAssetsURL(s string) error {
	if strings.ContainsAny(s, " \t\r\n;,'\"<>") {
		return fmt.Errorf("reports: the assets URL %q contains spaces, quotes, ';', ',' or angle brackets; give the URL of echarts.min.js (e.g. https://cdn.jsdelivr.net/npm/echarts@%s/dist/echarts.min.js)", s, EChartsVersion)
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("reports: the assets URL %q is not a URL: %w", s, err)
	}
	switch u.Scheme {
	case "http", "https", "file", "":
	default:
		return fmt.Errorf("reports: the assets URL %q has scheme %q; use http, https, file or a path relative to the page", s, u.Scheme)
	}
	return nil
}

// assetsScript is the URL of the script for an assets option: a URL ending
// in .js is the script itself, any other is a folder holding echarts.min.js.
func assetsScript(s string) string {
	if strings.HasSuffix(s, ".js") {
		return s
	}
	if !strings.HasSuffix(s, "/") {
		s += "/"
	}
	return s + "echarts.min.js"
}

// render writes the page of charts and tables with the ECharts script
// inlined (script != nil) or loaded from scriptURL.
func render(title string, notes []string, tables []table, specs []chartSpec, script []byte, scriptURL string) ([]byte, error) {
	type item struct {
		ID     string          `json:"id"`
		Option json.RawMessage `json:"option"`
	}
	items := make([]item, 0, len(specs))
	for i := range specs {
		b, err := specs[i].optionJSON()
		if err != nil {
			return nil, err
		}
		items = append(items, item{specs[i].ID, b})
	}
	opt, err := json.Marshal(items) // escapes <, > and &: nothing can end the script element
	if err != nil {
		return nil, fmt.Errorf("reports: encoding the charts: %w", err)
	}
	p := page{Title: title, Notes: notes, Tables: tables, Options: template.JS(opt), Init: template.JS(initJS)}
	for i := range specs {
		p.Charts = append(p.Charts, pageChart{ID: specs[i].ID, Height: specs[i].height(), Wide: specs[i].Wide})
	}
	scriptSrc := "'unsafe-inline'"
	if scriptURL != "" {
		p.ScriptURL = scriptURL
		scriptSrc += " " + scriptURL
	} else {
		if bytes.Contains(bytes.ToLower(script), []byte("</script")) {
			return nil, fmt.Errorf("reports: the ECharts script contains </script and cannot be inlined")
		}
		p.Script = template.JS(script)
	}
	// Nothing but the page's own scripts and styles: a page shows the same
	// offline as online, and cannot send anything anywhere.
	p.CSP = "default-src 'none'; script-src " + scriptSrc + "; style-src 'unsafe-inline'; img-src data: blob:"
	var buf bytes.Buffer
	if err := pageTpl.Execute(&buf, p); err != nil {
		return nil, fmt.Errorf("reports: rendering the page: %w", err)
	}
	return buf.Bytes(), nil
}
