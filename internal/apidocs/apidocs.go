// Package apidocs renders the API reference (docs/api-reference.md) from the
// generated CustomResourceDefinitions, so the reference says exactly what the
// API server validates: types, required fields, enums, bounds and the CEL
// rules (immutability, may-only-grow), with the Go doc comments as text.
package apidocs

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// Render writes the reference for the CRDs given as YAML documents, in the
// order given.
func Render(crds ...[]byte) (string, error) {
	var b strings.Builder
	b.WriteString("# API reference\n\n")
	b.WriteString("Generated from config/crd/bases by `make api-docs` (internal/apidocs); do not edit.\n")
	b.WriteString("The wire contract around these types (annotations, verdicts, the signed grant) is in\n")
	b.WriteString("[protecting-objects.md](protecting-objects.md) and [security.md](security.md).\n")
	for _, raw := range crds {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
			return "", fmt.Errorf("parsing a CRD: %w", err)
		}
		if crd.Spec.Names.Kind == "" {
			return "", fmt.Errorf("a CRD without spec.names.kind")
		}
		for _, v := range crd.Spec.Versions {
			renderVersion(&b, &crd, v)
		}
	}
	return b.String(), nil
}

func renderVersion(b *strings.Builder, crd *apiextensionsv1.CustomResourceDefinition, v apiextensionsv1.CustomResourceDefinitionVersion) {
	n := crd.Spec.Names
	fmt.Fprintf(b, "\n## %s (%s/%s)\n\n", n.Kind, crd.Spec.Group, v.Name)
	fmt.Fprintf(b, "Scope: %s. Plural `%s`", crd.Spec.Scope, n.Plural)
	if len(n.ShortNames) > 0 {
		fmt.Fprintf(b, ", short names `%s`", strings.Join(n.ShortNames, "`, `"))
	}
	if len(n.Categories) > 0 {
		fmt.Fprintf(b, ", categories `%s`", strings.Join(n.Categories, "`, `"))
	}
	b.WriteString(".")
	if v.Subresources != nil && v.Subresources.Status != nil {
		b.WriteString(" Status is a subresource (`/status`).")
	}
	b.WriteString("\n")
	if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
		return
	}
	root := v.Schema.OpenAPIV3Schema
	if root.Description != "" {
		fmt.Fprintf(b, "\n%s\n", oneParagraph(root.Description))
	}
	if len(v.AdditionalPrinterColumns) > 0 {
		b.WriteString("\n`kubectl get` columns: ")
		cols := make([]string, 0, len(v.AdditionalPrinterColumns))
		for _, c := range v.AdditionalPrinterColumns {
			cols = append(cols, fmt.Sprintf("%s (`%s`)", c.Name, c.JSONPath))
		}
		b.WriteString(strings.Join(cols, ", ") + ".\n")
	}
	for _, top := range []string{"spec", "status"} {
		p, ok := root.Properties[top]
		if !ok {
			continue
		}
		fmt.Fprintf(b, "\n### %s\n\n", top)
		if len(p.XValidations) > 0 {
			for _, r := range p.XValidations {
				fmt.Fprintf(b, "- Rule: %s\n", rule(r))
			}
			b.WriteString("\n")
		}
		b.WriteString("| Field | Type | Description |\n|---|---|---|\n")
		renderFields(b, top, &p)
	}
}

// renderFields writes one row per property below s, depth first, in name order.
func renderFields(b *strings.Builder, path string, s *apiextensionsv1.JSONSchemaProps) {
	props, item := s.Properties, s
	if s.Type == "array" && s.Items != nil && s.Items.Schema != nil {
		props, item = s.Items.Schema.Properties, s.Items.Schema
		path += "[]"
	}
	names := make([]string, 0, len(props))
	for name := range props {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		p := props[name]
		fp := path + "." + name
		fmt.Fprintf(b, "| `%s` | %s | %s |\n", fp, typeOf(&p), cell(&p, slices.Contains(item.Required, name)))
		renderFields(b, fp, &p)
	}
}

func typeOf(s *apiextensionsv1.JSONSchemaProps) string {
	t := s.Type
	switch {
	case s.XIntOrString:
		t = "int or string"
	case t == "array" && s.Items != nil && s.Items.Schema != nil:
		t = "[]" + typeOf(s.Items.Schema)
	case t == "object" && s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
		t = "map[string]" + typeOf(s.AdditionalProperties.Schema)
	case t == "":
		t = "any"
	}
	if s.Format != "" {
		t += " (" + s.Format + ")"
	}
	return t
}

// cell is a field's description followed by what the API server enforces.
func cell(s *apiextensionsv1.JSONSchemaProps, required bool) string {
	var parts []string
	if d := oneParagraph(s.Description); d != "" {
		parts = append(parts, d)
	}
	if required {
		parts = append(parts, "**Required.**")
	}
	if len(s.Enum) > 0 {
		vals := make([]string, 0, len(s.Enum))
		for _, e := range s.Enum {
			vals = append(vals, "`"+strings.Trim(string(e.Raw), `"`)+"`")
		}
		parts = append(parts, "One of "+strings.Join(vals, ", ")+".")
	}
	if s.Default != nil {
		parts = append(parts, "Default `"+strings.Trim(string(s.Default.Raw), `"`)+"`.")
	}
	parts = append(parts, bounds(s)...)
	for _, r := range s.XValidations {
		parts = append(parts, "Rule: "+rule(r))
	}
	return strings.Join(parts, " ")
}

func bounds(s *apiextensionsv1.JSONSchemaProps) []string {
	var out []string
	if s.Minimum != nil {
		out = append(out, "Minimum "+num(*s.Minimum)+".")
	}
	if s.Maximum != nil {
		out = append(out, "Maximum "+num(*s.Maximum)+".")
	}
	if s.MinLength != nil {
		out = append(out, fmt.Sprintf("Minimum length %d.", *s.MinLength))
	}
	if s.MaxLength != nil {
		out = append(out, fmt.Sprintf("Maximum length %d.", *s.MaxLength))
	}
	if s.MaxItems != nil {
		out = append(out, fmt.Sprintf("At most %d items.", *s.MaxItems))
	}
	if s.Pattern != "" {
		out = append(out, "Pattern `"+s.Pattern+"`.")
	}
	return out
}

func rule(r apiextensionsv1.ValidationRule) string {
	if r.Message != "" {
		return fmt.Sprintf("%s (`%s`)", strings.TrimSuffix(r.Message, "."), r.Rule)
	}
	return "`" + r.Rule + "`"
}

// oneParagraph joins a doc comment into one table-safe line.
func oneParagraph(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

// num prints a bound in full (an int64 bound as 4611686018427387904, not 4.6e+18).
func num(f float64) string {
	if f == math.Trunc(f) {
		return strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}
