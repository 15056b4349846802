package fencectl

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// errNoKubeconfig is the error when nothing says which cluster to talk to.
var errNoKubeconfig = errors.New("no kubeconfig found")

// noKubeconfig explains client-go's "no configuration has been provided, try
// setting KUBERNETES_MASTER" (which names a variable nothing reads any more):
// where the plugin looked, as kubectl looks, and how to point it at a cluster.
func noKubeconfig(access clientcmd.ConfigAccess) error {
	var b strings.Builder
	b.WriteString("kubectl fence looked for:\n")
	for _, line := range lookedFor(access) {
		fmt.Fprintf(&b, "  - %s\n", line)
	}
	b.WriteString(`Point it at a cluster with one of:
  export KUBECONFIG=/path/to/kubeconfig
  kubectl fence --kubeconfig /path/to/kubeconfig ...
For the local control plane, run 'make dev' in the fencekeeper repository:
once ready it prints the line to export (export KUBECONFIG=<absolute path>).`)
	return fmt.Errorf("%w; %s", errNoKubeconfig, b.String())
}

// lookedFor says, for each place a kubeconfig is looked for, what was found
// there: the files of --kubeconfig or $KUBECONFIG (else ~/.kube/config), and
// a pod's in-cluster configuration.
func lookedFor(access clientcmd.ConfigAccess) []string {
	var out []string
	if access == nil {
		return []string{"(no loading rules)"}
	}
	switch explicit := access.GetExplicitFile(); {
	case explicit != "":
		out = append(out, "--kubeconfig "+explicit+": "+fileState(explicit))
	case os.Getenv(clientcmd.RecommendedConfigPathEnvVar) != "":
		var files []string
		for _, p := range access.GetLoadingPrecedence() {
			files = append(files, p+" ("+fileState(p)+")")
		}
		out = append(out, "$KUBECONFIG: "+strings.Join(files, ", "))
	default:
		out = append(out, "$KUBECONFIG: not set")
		for _, p := range access.GetLoadingPrecedence() {
			out = append(out, p+": "+fileState(p))
		}
	}
	if _, err := rest.InClusterConfig(); errors.Is(err, rest.ErrNotInCluster) {
		out = append(out, "a pod's in-cluster configuration: not in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set)")
	} else if err != nil {
		out = append(out, "a pod's in-cluster configuration: "+err.Error())
	}
	return out
}

// fileState says whether a kubeconfig file exists, for the hint above.
func fileState(path string) string {
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "does not exist"
	case err != nil:
		return err.Error()
	case st.IsDir():
		return "is a directory"
	case st.Size() == 0:
		return "is empty"
	}
	return "exists but defines no cluster"
}

// noCluster explains, when nothing names a cluster, why: no kubeconfig (no
// cluster in any file), or a kubeconfig that selects no context. client-go
// would fall back, as kubectl does, to http://localhost:8080, and every
// command would fail with "connection refused" to a server nobody named.
// It returns nil when a cluster is named (by a context, --server or a pod).
func (o *options) noCluster() error {
	f := o.flags
	if (f.APIServer != nil && *f.APIServer != "") || (f.ClusterName != nil && *f.ClusterName != "") || (f.Context != nil && *f.Context != "") {
		return nil
	}
	if _, err := rest.InClusterConfig(); err == nil {
		return nil
	}
	loader := f.ToRawKubeConfigLoader()
	raw, err := loader.RawConfig()
	switch {
	case err != nil:
		return nil // client-go's own error says what is wrong with the file
	case len(raw.Clusters) == 0:
		return noKubeconfig(loader.ConfigAccess())
	case raw.CurrentContext == "":
		contexts := make([]string, 0, len(raw.Contexts))
		for name := range raw.Contexts {
			contexts = append(contexts, name)
		}
		sort.Strings(contexts)
		return fmt.Errorf("%w: the kubeconfig (%s) sets no current-context: pick one with --context NAME, or kubectl config use-context NAME (contexts: %s)",
			errNoKubeconfig, strings.Join(loader.ConfigAccess().GetLoadingPrecedence(), ":"), strings.Join(contexts, ", "))
	}
	return nil
}
