package fence

// ObjectPayload returns the business content of a Kubernetes object given as
// an unstructured map (the JSON form): for a core/v1 ConfigMap the object
// {"binaryData":…,"data":…} without empty members, for anything else its spec
// ({} when absent). binaryData stays in its JSON form, standard base64.
func ObjectPayload(obj map[string]any) map[string]any {
	if obj["apiVersion"] == "v1" && obj["kind"] == "ConfigMap" {
		p := map[string]any{}
		for _, k := range []string{"data", "binaryData"} {
			if m, ok := obj[k].(map[string]any); ok && len(m) > 0 {
				p[k] = m
			}
		}
		return p
	}
	if spec, ok := obj["spec"].(map[string]any); ok {
		return spec
	}
	return map[string]any{}
}
