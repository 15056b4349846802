package fencectl

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// completionTimeout bounds the API calls behind a completion: a shell waits
// for them on every TAB.
const completionTimeout = 5 * time.Second

// completionCmd writes the shell completion script for the kubectl-fence
// binary. `kubectl fence …` is completed by kubectl itself, which runs the
// kubectl_complete-fence helper shipped next to the binary.
func completionCmd(root *cobra.Command, stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish|powershell",
		Short: "Print the shell completion script for kubectl-fence",
		Long: `completion prints a completion script for the kubectl-fence binary:

  source <(kubectl-fence completion bash)

'kubectl fence …' (through kubectl) is completed by kubectl's own completion,
which calls the kubectl_complete-fence helper found on PATH (kubectl 1.26 or
later); put it next to kubectl-fence. See docs/kubectl-fence.md.`,
		Example: `  # bash (needs bash-completion v2)
  source <(kubectl-fence completion bash)

  # zsh
  kubectl-fence completion zsh > "${fpath[1]}/_kubectl-fence"`,
		ValidArgs: []string{"bash", "zsh", "fish", "powershell"},
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		RunE: func(_ *cobra.Command, args []string) error {
			// The script completes the binary's own name.
			root.Use = "kubectl-fence"
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(stdout, true)
			case "zsh":
				return root.GenZshCompletion(stdout)
			case "fish":
				return root.GenFishCompletion(stdout, true)
			default:
				return root.GenPowerShellCompletionWithDesc(stdout)
			}
		},
	}
}

// completeFirst completes the first argument with the names list returns,
// read from the API server in the -n namespace; later arguments get nothing.
func (o *options) completeFirst(list func(ctx context.Context, kube client.Client, ns string) ([]cobra.Completion, error)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		kube, err := o.kube()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
		defer cancel()
		names, err := list(ctx, kube, o.ns())
		if err != nil {
			cobra.CompDebugln(err.Error(), true)
			return nil, cobra.ShellCompDirectiveError
		}
		return withPrefix(names, toComplete), cobra.ShellCompDirectiveNoFileComp
	}
}

// withPrefix keeps the completions ("name\tdescription") whose name starts
// with prefix, sorted.
func withPrefix(all []cobra.Completion, prefix string) []cobra.Completion {
	out := []cobra.Completion{}
	for _, c := range all {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	sort.Strings(out)
	return out
}

// lockGrantNames lists the namespace's LockGrants, described by phase and owner.
func lockGrantNames(ctx context.Context, kube client.Client, ns string) ([]cobra.Completion, error) {
	var list locksv1.LockGrantList
	if err := kube.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := make([]cobra.Completion, 0, len(list.Items))
	for i := range list.Items {
		v := viewOf(&list.Items[i])
		desc := fmt.Sprintf("%s, %s by %s", v.Resource, v.Phase, v.Owner)
		if v.Fence > 0 {
			desc += fmt.Sprintf(", fence %d", v.Fence)
		}
		out = append(out, cobra.CompletionWithDesc(v.Name, desc))
	}
	return out, nil
}

// fencedResourceNames lists the namespace's FencedResources, described by target.
func fencedResourceNames(ctx context.Context, kube client.Client, ns string) ([]cobra.Completion, error) {
	var list locksv1.FencedResourceList
	if err := kube.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := make([]cobra.Completion, 0, len(list.Items))
	for _, fr := range list.Items {
		desc := "no target"
		if t := fr.Spec.Target; t != nil {
			desc = t.Kind + "/" + t.Name
		}
		out = append(out, cobra.CompletionWithDesc(fr.Name, desc))
	}
	return out, nil
}

// registerFlagCompletions completes -n from the API server and --context,
// --cluster and --user from the kubeconfig, as kubectl does.
func (o *options) registerFlagCompletions(root *cobra.Command) {
	_ = root.RegisterFlagCompletionFunc("namespace", func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		kube, err := o.kube()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
		defer cancel()
		var list corev1.NamespaceList
		if err := kube.List(ctx, &list); err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		names := make([]cobra.Completion, 0, len(list.Items))
		for _, n := range list.Items {
			names = append(names, n.Name)
		}
		return withPrefix(names, toComplete), cobra.ShellCompDirectiveNoFileComp
	})
	fromKubeconfig := func(keys func(contexts, clusters, users []string) []string) cobra.CompletionFunc {
		return func(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			raw, err := o.flags.ToRawKubeConfigLoader().RawConfig()
			if err != nil {
				return nil, cobra.ShellCompDirectiveError
			}
			var contexts, clusters, users []string
			for k := range raw.Contexts {
				contexts = append(contexts, k)
			}
			for k := range raw.Clusters {
				clusters = append(clusters, k)
			}
			for k := range raw.AuthInfos {
				users = append(users, k)
			}
			return withPrefix(keys(contexts, clusters, users), toComplete), cobra.ShellCompDirectiveNoFileComp
		}
	}
	_ = root.RegisterFlagCompletionFunc("context", fromKubeconfig(func(c, _, _ []string) []string { return c }))
	_ = root.RegisterFlagCompletionFunc("cluster", fromKubeconfig(func(_, c, _ []string) []string { return c }))
	_ = root.RegisterFlagCompletionFunc("user", fromKubeconfig(func(_, _, u []string) []string { return u }))
}
