package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// network is a bridge in the host namespace and one network namespace per
// node, each joined to the bridge by a veth pair: every node has its own
// address, and a partition is a real cut (blackhole routes in both
// namespaces), not a closed socket. Only iproute2 is needed (and root).
type network struct {
	id     int    // distinguishes concurrent runs: names and the 10.77.<id>.0/24 subnet
	bridge string // in the host namespace, holds .1
	nodes  map[string]*node
}

// node is one machine of the topology.
type node struct {
	name string
	ns   string // network namespace
	ip   string
	veth string // host end of its veth pair; the namespace end is eth0
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNetwork creates the bridge; it first removes what a killed run with the
// same id left behind.
func newNetwork(id int) (*network, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the chaos control plane needs root (network namespaces, veth, tc); running as uid %d", os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("the chaos control plane needs iproute2 (ip, tc): %w", err)
	}
	n := &network{id: id, bridge: fmt.Sprintf("fkc%d", id), nodes: map[string]*node{}}
	n.removeLeftovers()
	if err := run("ip", "link", "add", n.bridge, "type", "bridge"); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"ip", "addr", "add", n.subnet(1) + "/24", "dev", n.bridge},
		{"ip", "link", "set", n.bridge, "up"},
	} {
		if err := run(args...); err != nil {
			n.close()
			return nil, err
		}
	}
	return n, nil
}

func (n *network) subnet(host int) string { return fmt.Sprintf("10.77.%d.%d", n.id, host) }

func (n *network) prefix() string { return fmt.Sprintf("fkc%d-", n.id) }

// add creates a node with address 10.77.<id>.<host>.
func (n *network) add(name string, host int) (*node, error) {
	nd := &node{name: name, ns: n.prefix() + name, ip: n.subnet(host), veth: fmt.Sprintf("fkc%dv%d", n.id, host)}
	steps := [][]string{
		{"ip", "netns", "add", nd.ns},
		{"ip", "link", "add", nd.veth, "type", "veth", "peer", "name", "eth0", "netns", nd.ns},
		{"ip", "link", "set", nd.veth, "master", n.bridge, "up"},
		{"ip", "-n", nd.ns, "addr", "add", nd.ip + "/24", "dev", "eth0"},
		{"ip", "-n", nd.ns, "link", "set", "eth0", "up"},
		{"ip", "-n", nd.ns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return nil, err
		}
	}
	n.nodes[name] = nd
	return nd, nil
}

// cut makes a and b unreachable from each other (both directions), including
// connections already open: each drops the other's packets at routing.
func (n *network) cut(a, b *node) error {
	if err := run("ip", "-n", a.ns, "route", "replace", "blackhole", b.ip+"/32"); err != nil {
		return err
	}
	return run("ip", "-n", b.ns, "route", "replace", "blackhole", a.ip+"/32")
}

// heal removes every cut and every tc qdisc.
func (n *network) heal() error {
	var first error
	for _, nd := range n.nodes {
		out, _ := exec.Command("ip", "-n", nd.ns, "route", "show", "type", "blackhole").Output()
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "blackhole" {
				if err := run("ip", "-n", nd.ns, "route", "del", "blackhole", f[1]); err != nil && first == nil {
					first = err
				}
			}
		}
		_ = exec.Command("tc", "-n", nd.ns, "qdisc", "del", "dev", "eth0", "root").Run() // none: fine
	}
	return first
}

// degrade delays and drops a node's outgoing packets: tc netem (delayMs ±
// a quarter, lossPct random loss) where the kernel has it, otherwise a token
// bucket (tbf) at 512 kbit/s holding at most delayMs of queue — queueing
// delay and tail drops under load. It returns which it used.
func (n *network) degrade(nd *node, delayMs, lossPct int) (string, error) {
	err := run("tc", "-n", nd.ns, "qdisc", "replace", "dev", "eth0", "root", "netem",
		"delay", fmt.Sprintf("%dms", delayMs), fmt.Sprintf("%dms", delayMs/4), "loss", fmt.Sprintf("%d%%", lossPct))
	if err == nil {
		return fmt.Sprintf("netem %d ms, %d%% loss", delayMs, lossPct), nil
	}
	if !strings.Contains(err.Error(), "qdisc kind is unknown") {
		return "", err
	}
	err = run("tc", "-n", nd.ns, "qdisc", "replace", "dev", "eth0", "root", "tbf",
		"rate", "512kbit", "burst", "8kbit", "latency", fmt.Sprintf("%dms", delayMs))
	return fmt.Sprintf("no netem in this kernel: tbf 512 kbit/s, queue ≤ %d ms, tail drops", delayMs), err
}

// exec is the command line running argv in nd's namespace (ip netns exec
// execs argv in place: the process's PID is the program's).
func (nd *node) exec(argv ...string) []string {
	return append([]string{"ip", "netns", "exec", nd.ns}, argv...)
}

func (n *network) close() {
	for _, nd := range n.nodes {
		_ = exec.Command("ip", "netns", "del", nd.ns).Run()
	}
	_ = exec.Command("ip", "link", "del", n.bridge).Run()
}

func (n *network) removeLeftovers() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], n.prefix()) {
			_ = exec.Command("ip", "netns", "del", f[0]).Run()
		}
	}
	_ = exec.Command("ip", "link", "del", n.bridge).Run()
}
