package fencectl

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/fencekeeper/fencekeeper/internal/version"
)

// versionCmd prints the plugin's own version. The operator's version is not
// reported: it exposes none yet (a build_info metric is planned), and
// guessing it from the image tag would be wrong after `kubectl set image`.
func (o *options) versionCmd() *cobra.Command {
	var client bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the kubectl fence version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			info := version.Get()
			return o.emit(map[string]version.Info{"clientVersion": info}, nil, func(bool) error {
				_, err := fmt.Fprintln(o.stdout, "Client Version:", info.String())
				return err
			})
		},
	}
	o.addOutputFlags(cmd)
	// Accepted for kubectl's muscle memory; only the client version is printed anyway.
	cmd.Flags().BoolVar(&client, "client", false, "Print the client version only (the default: the operator reports no version yet).")
	return cmd
}
