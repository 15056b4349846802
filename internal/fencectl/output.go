package fencectl

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"text/template"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"
)

// Every command prints one document. The structured formats all render that
// document: -o json and -o yaml as they are, -o jsonpath and -o go-template on
// its JSON form, so a template addresses the same keys -o json shows. -o name
// prints kubectl's resource/name for the objects a command has; -o wide adds
// columns to the tables that have more to show. No -o is the human text.

// Output kinds that are not a template.
const (
	outText = ""
	outJSON = "json"
	outYAML = "yaml"
	outName = "name"
	outWide = "wide"
)

// What a command's output supports beyond the structured formats, in its
// cobra annotations.
const (
	annotationOutput = "fencekeeper.dev/output"
	supportsName     = "name"
	supportsWide     = "wide"
)

// templateFormats are kubectl's template output formats: engine, and whether
// the argument is a file.
var templateFormats = map[string]struct {
	engine   string
	file     bool
	jsonOnly bool
}{
	"jsonpath":         {engine: "jsonpath"},
	"jsonpath-file":    {engine: "jsonpath", file: true},
	"jsonpath-as-json": {engine: "jsonpath", jsonOnly: true},
	"go-template":      {engine: "go-template"},
	"go-template-file": {engine: "go-template", file: true},
	"template":         {engine: "go-template"},
	"templatefile":     {engine: "go-template", file: true},
}

// format is a parsed -o: a kind, or a template ready to run.
type format struct {
	kind string
	exec func(w io.Writer, data any) error
}

func (f format) structured() bool { return f.kind != outText && f.kind != outWide }

// parseFormat reads -o (and --template, --allow-missing-template-keys) as
// kubectl does: -o jsonpath='{…}', -o jsonpath --template '{…}',
// -o go-template-file=FILE, …
func parseFormat(output, templateArg string, allowMissing bool) (format, error) {
	name, arg, hasArg := strings.Cut(output, "=")
	switch name {
	case outText, outJSON, outYAML, outName, outWide:
		if hasArg {
			return format{}, fmt.Errorf("-o %s takes no template", name)
		}
		return format{kind: name}, nil
	}
	tf, ok := templateFormats[name]
	if !ok {
		return format{}, fmt.Errorf("unknown output format %q: use -o json, yaml, name, wide, jsonpath=…, jsonpath-file=…, go-template=… or go-template-file=…, or leave -o out for text", output)
	}
	if !hasArg {
		arg = templateArg
	}
	if arg == "" {
		return format{}, fmt.Errorf("-o %s needs a template: -o %s=TEMPLATE or --template", name, name)
	}
	if tf.file {
		data, err := os.ReadFile(arg)
		if err != nil {
			return format{}, fmt.Errorf("read the -o %s template: %w", name, err)
		}
		arg = string(data)
	}
	if tf.engine == "jsonpath" {
		return jsonpathFormat(name, arg, allowMissing, tf.jsonOnly)
	}
	return goTemplateFormat(name, arg, allowMissing)
}

func jsonpathFormat(name, tmpl string, allowMissing, asJSON bool) (format, error) {
	p, err := printers.NewJSONPathPrinter(tmpl)
	if err != nil {
		return format{}, fmt.Errorf("-o %s: bad jsonpath template %q: %w", name, tmpl, err)
	}
	p.AllowMissingKeys(allowMissing)
	p.EnableJSONOutput(asJSON)
	return format{kind: name, exec: p.Execute}, nil
}

// goTemplateFormat has kubectl's go-template functions (exists, base64decode).
func goTemplateFormat(name, tmpl string, allowMissing bool) (format, error) {
	t, err := template.New("output").Funcs(template.FuncMap{"exists": exists, "base64decode": base64decode}).Parse(tmpl)
	if err != nil {
		return format{}, fmt.Errorf("-o %s: bad template %q: %w", name, tmpl, err)
	}
	if allowMissing {
		t.Option("missingkey=default")
	} else {
		t.Option("missingkey=error")
	}
	return format{kind: name, exec: func(w io.Writer, data any) error { return t.Execute(w, data) }}, nil
}

func base64decode(v string) (string, error) {
	data, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return "", fmt.Errorf("base64 decode failed: %w", err)
	}
	return string(data), nil
}

// exists says whether the path of keys and indices leads somewhere in item.
func exists(item any, indices ...any) bool {
	v := reflect.ValueOf(item)
	for _, i := range indices {
		for v.IsValid() && v.Kind() == reflect.Interface {
			v = v.Elem()
		}
		index := reflect.ValueOf(i)
		switch {
		case !v.IsValid():
			return false
		case v.Kind() == reflect.Map && index.IsValid() && index.Type().AssignableTo(v.Type().Key()):
			v = v.MapIndex(index)
		case (v.Kind() == reflect.Slice || v.Kind() == reflect.Array) && index.CanInt():
			n := int(index.Int())
			if n < 0 || n >= v.Len() {
				return false
			}
			v = v.Index(n)
		default:
			return false
		}
	}
	return v.IsValid()
}

// checkOutput validates -o for cmd before it does anything: a command that
// changes state must not act and then fail to print.
func (o *options) checkOutput(cmd *cobra.Command) error {
	if cmd.Flags().Lookup("output") == nil {
		return nil
	}
	f, err := parseFormat(*o.print.OutputFormat, *o.print.TemplatePrinterFlags.TemplateArgument, *o.print.TemplatePrinterFlags.AllowMissingKeys)
	if err != nil {
		return err
	}
	supports := cmd.Annotations[annotationOutput]
	switch {
	case f.kind == outName && !strings.Contains(supports, supportsName):
		return fmt.Errorf("-o name prints object names: acquire, renew, release and status have them (%s prints no object; use -o json or -o yaml)", cmd.Name())
	case f.kind == outWide && !strings.Contains(supports, supportsWide):
		return fmt.Errorf("-o wide adds columns to the status and audit output; %s has none to add (use -o json or -o yaml)", cmd.Name())
	}
	o.format = f
	return nil
}

// emit prints a command's result in the chosen format: doc for the
// structured formats, names for -o name, text for the default and -o wide.
func (o *options) emit(doc any, names []string, text func(wide bool) error) error {
	switch o.format.kind {
	case outText, outWide:
		return text(o.format.kind == outWide)
	case outName:
		for _, n := range names {
			o.printf("%s\n", n)
		}
		return nil
	case outJSON:
		return o.json(doc)
	case outYAML:
		return o.yaml(doc)
	}
	data, err := jsonForm(doc)
	if err != nil {
		return err
	}
	if err := o.format.exec(o.stdout, data); err != nil {
		return fmt.Errorf("-o %s: %w", o.format.kind, err)
	}
	return nil
}

// json prints v as indented JSON.
func (o *options) json(v any) error {
	enc := json.NewEncoder(o.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// yaml prints the YAML form of v's JSON, so the two always carry the same data.
func (o *options) yaml(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	out, err := yaml.JSONToYAML(data)
	if err != nil {
		return err
	}
	_, err = o.stdout.Write(out)
	return err
}

// jsonForm is v as -o json shows it, as generic maps and slices for the
// template engines; numbers stay exact (fence tokens are int64).
func jsonForm(v any) (any, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out any
	if err := dec.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}

// addOutputFlags gives cmd kubectl's -o, --template,
// --allow-missing-template-keys and --show-managed-fields, and says which of
// name and wide its output has.
func (o *options) addOutputFlags(cmd *cobra.Command, supports ...string) {
	o.print.AddFlags(cmd)
	formats := []string{"json", "yaml", "jsonpath=", "jsonpath-file=", "go-template=", "go-template-file="}
	formats = append(formats, supports...)
	cmd.Flags().Lookup("output").Usage = "Output format. One of: (" + strings.Join(formats, ", ") + "). Default: text."
	cmd.Flags().Lookup("template").Usage = "Template string or path to template file to use when -o jsonpath, jsonpath-file, go-template or go-template-file has no =TEMPLATE. Templates see the -o json document."
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annotationOutput] = strings.Join(supports, " ")
	_ = cmd.RegisterFlagCompletionFunc("output", func(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return withPrefix(formats, toComplete), cobra.ShellCompDirectiveNoFileComp
	})
}

// newPrintFlags are kubectl's printing flags, without a default output.
func newPrintFlags() *genericclioptions.PrintFlags {
	return genericclioptions.NewPrintFlags("")
}
