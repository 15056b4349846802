package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Fault kinds the nemesis injects.
const (
	faultEtcdMember   = "partition one etcd member"
	faultEtcdMajority = "partition an etcd majority"
	faultLeader       = "partition the leader operator from the API servers"
	faultAPIEtcd      = "partition an API server from etcd"
	faultReplicaAPI   = "partition a webhook replica from its API server"
	faultKill         = "kill -9 and restart"
	faultPause        = "pause (SIGSTOP) past a lease"
	faultLeaderPause  = "pause the leader operator past its leader lease"
	faultNetem        = "delay and drop packets (tc)"
	faultSkew         = "skew an operator's clock"
	faultStoreOps     = "partition the store from the operators"
	faultStoreWorkers = "partition the store from the workers"
	faultStoreKill    = "kill -9 and restart the store"
)

// faultNames are the short names -faults takes.
var faultNames = map[string]string{
	"etcd-member": faultEtcdMember, "etcd-majority": faultEtcdMajority, "leader": faultLeader, "api-etcd": faultAPIEtcd,
	"replica-api": faultReplicaAPI, "kill": faultKill, "pause": faultPause, "leader-pause": faultLeaderPause, "degrade": faultNetem, "skew": faultSkew,
	"store-operators": faultStoreOps, "store-workers": faultStoreWorkers, "store-kill": faultStoreKill,
}

// FaultKinds resolves -faults (comma-separated short names; empty: all).
func FaultKinds(names string) ([]string, error) {
	if names == "" {
		return faultKinds, nil
	}
	var out []string
	for _, n := range strings.Split(names, ",") {
		k, ok := faultNames[n]
		if !ok {
			return nil, fmt.Errorf("unknown fault %q (known: etcd-member, etcd-majority, leader, api-etcd, replica-api, kill, pause, leader-pause, degrade, skew, store-operators, store-workers, store-kill)", n)
		}
		out = append(out, k)
	}
	return out, nil
}

var faultKinds = []string{faultEtcdMember, faultEtcdMajority, faultLeader, faultAPIEtcd, faultReplicaAPI, faultKill, faultPause, faultLeaderPause, faultNetem, faultSkew,
	faultStoreOps, faultStoreWorkers, faultStoreKill}

// fault is one planned injection: the schedule is a list of them, drawn
// from the seed before anything runs, so a seed replays the same plan.
type fault struct {
	Kind   string
	Pick   int           // which member / process / node (resolved when applied)
	Start  time.Duration // after the schedule's start
	Length time.Duration
	Amount int // skew seconds, delay ms
	// Filled in when applied.
	Target     string
	at, healed time.Time
	applyErr   string
}

func (f fault) String() string {
	s := fmt.Sprintf("+%-5v %-52s for %v", f.Start.Round(100*time.Millisecond), f.Kind, f.Length.Round(100*time.Millisecond))
	if f.Target != "" {
		s += " on " + f.Target
	}
	if f.Kind == faultSkew {
		s += fmt.Sprintf(" (%+ds)", f.Amount)
	}
	if f.applyErr != "" {
		s += " [not applied: " + f.applyErr + "]"
	}
	return s
}

// plan draws a schedule of faults, one at a time with quiet gaps, that
// fills length; every kind appears once before any repeats (shuffled).
func plan(seed uint64, length time.Duration, kinds []string) []fault {
	rnd := rand.New(rand.NewPCG(seed, 0x6368616f73))
	var out []fault
	at := 3 * time.Second
	var bag []string
	for {
		if len(bag) == 0 {
			bag = append([]string(nil), kinds...)
			rnd.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
		}
		f := fault{Kind: bag[0], Pick: rnd.IntN(1 << 20), Start: at, Length: time.Duration(4000+rnd.IntN(6000)) * time.Millisecond}
		bag = bag[1:]
		switch f.Kind {
		case faultPause:
			f.Length = time.Duration(6000+rnd.IntN(4000)) * time.Millisecond // past the 5 s lease
		case faultLeaderPause:
			// Past the 15 s leader-election lease: the other replica takes
			// over while this one sleeps, and it wakes up still believing it leads.
			f.Length = time.Duration(18000+rnd.IntN(4000)) * time.Millisecond
		case faultSkew:
			f.Amount = (2 + rnd.IntN(6)) * (1 - 2*rnd.IntN(2))
		case faultNetem:
			f.Amount = 20 + rnd.IntN(130)
		}
		if at+f.Length > length {
			return out
		}
		out = append(out, f)
		at += f.Length + time.Duration(2000+rnd.IntN(2000))*time.Millisecond
	}
}

// apply injects f; the returned function heals it.
func (c *Cluster) apply(f *fault, workers []*proc) (func(), error) {
	switch f.Kind {
	case faultEtcdMember, faultEtcdMajority, faultLeader, faultAPIEtcd, faultReplicaAPI:
		return func() { _ = c.net.heal() }, c.partition(f)
	case faultKill, faultPause, faultLeaderPause:
		return c.disrupt(f, workers), nil
	case faultNetem:
		t := []*node{c.etcdNode(0), c.etcdNode(1), c.etcdNode(2), c.apiNode(0), c.apiNode(1), c.node("operator-1"), c.node("operator-2")}[f.Pick%7]
		how, err := c.net.degrade(t, f.Amount, 10)
		f.Target = t.name + " (" + how + ")"
		return func() { _ = c.net.heal() }, err
	case faultSkew:
		i := f.Pick % len(c.ops)
		f.Target = c.ops[i].name
		return func() { _ = os.WriteFile(c.skewFiles[i], []byte("0s"), 0o600) }, os.WriteFile(c.skewFiles[i], []byte(fmt.Sprintf("%ds", f.Amount)), 0o600)
	case faultStoreOps, faultStoreWorkers:
		return func() { _ = c.net.heal() }, c.partitionStore(f)
	case faultStoreKill:
		f.Target = "store"
		return func() {
			if err := c.store.restart(context.Background()); err != nil {
				c.logf("%v", err)
			}
		}, c.store.kill()
	}
	return func() {}, fmt.Errorf("unknown fault %q", f.Kind)
}

func (c *Cluster) etcdNode(i int) *node { return c.node(fmt.Sprintf("etcd-%d", i%3+1)) }
func (c *Cluster) apiNode(i int) *node  { return c.node(fmt.Sprintf("api-%d", i%2+1)) }

// isolate cuts a from every other node.
func (c *Cluster) isolate(a *node) error {
	for _, b := range c.net.nodes {
		if b != a {
			if err := c.net.cut(a, b); err != nil {
				return err
			}
		}
	}
	return nil
}

// partition applies a network cut; heal removes every cut.
func (c *Cluster) partition(f *fault) error {
	switch f.Kind {
	case faultEtcdMember:
		m := c.etcdNode(f.Pick)
		f.Target = m.name
		return c.isolate(m)
	case faultEtcdMajority:
		a, b := c.etcdNode(f.Pick), c.etcdNode(f.Pick+1)
		f.Target = a.name + "," + b.name
		if err := c.isolate(a); err != nil {
			return err
		}
		return c.isolate(b)
	case faultLeader:
		op := c.leader(f.Pick)
		f.Target = op.name
		if err := c.net.cut(op.node, c.apiNode(0)); err != nil {
			return err
		}
		return c.net.cut(op.node, c.apiNode(1))
	case faultAPIEtcd:
		a := c.apiNode(f.Pick)
		f.Target = a.name
		for i := 0; i < 3; i++ {
			if err := c.net.cut(a, c.etcdNode(i)); err != nil {
				return err
			}
		}
		return nil
	}
	// faultReplicaAPI: the replica that does not lead, cut from its own API
	// server only: its informers and registry reads hang while the other
	// API server's front end still sends it admission requests.
	i := 0
	if c.leader(f.Pick) == c.ops[0] {
		i = 1
	}
	f.Target = c.ops[i].name + " from " + c.apiNode(i).name
	return c.net.cut(c.ops[i].node, c.apiNode(i))
}

// partitionStore cuts the store from both operators (publication stops:
// the store keeps the last holder it was told about) or from every worker
// (commits in flight lose their answers).
func (c *Cluster) partitionStore(f *fault) error {
	peers := c.workerNodes
	f.Target = "store from the workers"
	if f.Kind == faultStoreOps {
		peers, f.Target = []*node{c.node("operator-1"), c.node("operator-2")}, "store from operator-1, operator-2"
	}
	for _, p := range peers {
		if err := c.net.cut(c.store.node, p); err != nil {
			return err
		}
	}
	return nil
}

// disrupt kills or pauses a process; the returned function restarts or resumes it.
func (c *Cluster) disrupt(f *fault, workers []*proc) func() {
	var p *proc
	switch {
	case f.Kind == faultKill:
		all := append(append(append(append([]*proc{}, c.etcd...), c.apis...), c.ops...), workers...)
		p = all[f.Pick%len(all)]
	case f.Kind == faultLeaderPause || f.Pick%2 == 0 || len(workers) == 0:
		p = c.leader(f.Pick / 2)
	default: // a worker, likely holding a lease
		p = workers[(f.Pick/2)%len(workers)]
	}
	f.Target = p.name
	if f.Kind == faultKill {
		p.kill()
		return func() { _ = p.start() }
	}
	p.signal(syscall.SIGSTOP)
	return func() { p.signal(syscall.SIGCONT) }
}

// leader is the running operator whose last "issuer ready" line since its
// last start has the highest epoch (else operator pick%2).
func (c *Cluster) leader(pick int) *proc {
	var best *proc
	bestEpoch := int64(-1)
	for _, p := range c.ops {
		if !p.running() {
			continue
		}
		data, err := os.ReadFile(p.logPath)
		if err != nil {
			continue
		}
		s := string(data)
		s = s[strings.LastIndex(s, "=== start")+1:]
		for _, m := range readyEpoch.FindAllStringSubmatch(s, -1) {
			if e, _ := strconv.ParseInt(m[1], 10, 64); e > bestEpoch {
				best, bestEpoch = p, e
			}
		}
	}
	if best == nil {
		return c.ops[pick%len(c.ops)]
	}
	return best
}

var readyEpoch = regexp.MustCompile(`"msg":"issuer ready","epoch":(\d+)`)
