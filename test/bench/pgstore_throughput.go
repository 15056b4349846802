package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// pgThroughput: closed-loop workers, each on its own connection, resource
// and row, in windows that rotate plain, contract floor and fenced.
type pgThroughput struct {
	Workers int        `json:"workers"`
	Windows []pgWindow `json:"windows"`
	Plain   pgWindow   `json:"plain"`
	Floor   pgWindow   `json:"contract_floor"`
	Fenced  pgWindow   `json:"fenced"`
	// Ratio: fenced over plain commits/s; FloorRatio: fenced over the
	// contract floor; FloorOverPlain: the floor over plain.
	Ratio          float64 `json:"ratio_fenced_over_plain"`
	FloorRatio     float64 `json:"ratio_fenced_over_floor"`
	FloorOverPlain float64 `json:"ratio_floor_over_plain"`
	// WindowRatios, FloorWindowRatios: fenced over plain, and over the
	// floor, commits/s, repetition by repetition.
	WindowRatios      []float64 `json:"repetition_ratios"`
	FloorWindowRatios []float64 `json:"repetition_ratios_over_floor"`
}

// pgWindow is one window, or a kind's windows pooled.
type pgWindow struct {
	Kind      string  `json:"kind"`
	Rep       int     `json:"repetition"`
	Commits   int     `json:"commits"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"commits_per_second"`
	Latency   dist    `json:"commit_latency"`
	// ServerCPU: CPU ms per commit of the server's processes (the
	// postmaster and its children); ClientCPU: of this process.
	ServerCPU float64 `json:"server_cpu_ms_per_commit"`
	ClientCPU float64 `json:"client_cpu_ms_per_commit"`
	// WALBytes: write-ahead log bytes per commit.
	WALBytes    float64 `json:"wal_bytes_per_commit"`
	MachineBusy float64 `json:"machine_busy"`

	samples          []time.Duration
	serverS, clientS float64
	walBytes         float64
	busyS, allS      float64
}

const (
	kindPlain  = "plain"
	kindFloor  = "contract floor"
	kindFenced = "fenced"
)

func (b *pgBench) throughput(ctx context.Context, log io.Writer) (pgThroughput, error) {
	out := pgThroughput{Workers: b.cfg.Workers}
	var pooled [txKinds]pgWindow
	for k := range pooled {
		pooled[k].Kind = txKind(k).String()
		if _, err := b.window(ctx, txKind(k), b.cfg.WindowWarmup); err != nil {
			return out, err
		}
	}
	for rep := range b.cfg.Reps {
		var perSecond [txKinds]float64
		for _, k := range rotated(rep % txKinds) {
			w, err := b.window(ctx, k, b.cfg.Window)
			if err != nil {
				return out, err
			}
			w.Rep = rep + 1
			out.Windows = append(out.Windows, w)
			perSecond[k] = w.PerSecond
			pooled[k].merge(w)
			fmt.Fprintf(log, "   window %d/%d %s: %d commits, %s/s, p50/p99 %s/%s ms\n", rep+1, b.cfg.Reps, w.Kind, w.Commits,
				fmtF(w.PerSecond), fmtF(w.Latency.P50), fmtF(w.Latency.P99))
		}
		out.WindowRatios = append(out.WindowRatios, ratio(perSecond[txFenced], perSecond[txPlain]))
		out.FloorWindowRatios = append(out.FloorWindowRatios, ratio(perSecond[txFenced], perSecond[txFloor]))
	}
	for k := range pooled {
		pooled[k].finish()
		if pooled[k].Commits == 0 {
			return out, errNoSamples
		}
	}
	out.Plain, out.Floor, out.Fenced = pooled[txPlain], pooled[txFloor], pooled[txFenced]
	out.Ratio = ratio(out.Fenced.PerSecond, out.Plain.PerSecond)
	out.FloorRatio = ratio(out.Fenced.PerSecond, out.Floor.PerSecond)
	out.FloorOverPlain = ratio(out.Floor.PerSecond, out.Plain.PerSecond)
	return out, nil
}

// window runs every worker's closed loop of one kind for d, and what it cost.
func (b *pgBench) window(ctx context.Context, kind txKind, d time.Duration) (pgWindow, error) {
	w := pgWindow{Kind: kind.String()}
	lsn0, err := b.walLSN(ctx)
	if err != nil {
		return w, err
	}
	server0, client0 := b.serverCPU(), selfCPU()
	busy0, all0 := machineCPU()
	start := time.Now()
	end := start.Add(d)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(b.pools))
	for i, pool := range b.pools {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(end) && ctx.Err() == nil {
				lat, _, err := b.resources[i].txn(ctx, pool, kind)
				if err != nil {
					errs[i] = err
					break
				}
				mine = append(mine, lat)
			}
			mu.Lock()
			w.samples = append(w.samples, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return w, err
		}
	}
	lsn1, err := b.walLSN(ctx)
	if err != nil {
		return w, err
	}
	busy1, all1 := machineCPU()
	w.Seconds = elapsed.Seconds()
	w.serverS, w.clientS = b.serverCPU()-server0, selfCPU()-client0
	w.walBytes, w.busyS, w.allS = float64(lsn1-lsn0), busy1-busy0, all1-all0
	w.finish()
	return w, nil
}

func (w *pgWindow) merge(x pgWindow) {
	w.samples = append(w.samples, x.samples...)
	w.Seconds += x.Seconds
	w.serverS += x.serverS
	w.clientS += x.clientS
	w.walBytes += x.walBytes
	w.busyS += x.busyS
	w.allS += x.allS
}

// finish computes the window's figures from its samples and counters.
func (w *pgWindow) finish() {
	w.Commits = len(w.samples)
	w.Latency = summarize(w.samples)
	if w.Seconds > 0 {
		w.PerSecond = round2(float64(w.Commits) / w.Seconds)
	}
	if w.Commits > 0 {
		n := float64(w.Commits)
		w.ServerCPU, w.ClientCPU, w.WALBytes = round2(w.serverS*1000/n), round2(w.clientS*1000/n), round2(w.walBytes/n)
	}
	if w.allS > 0 {
		w.MachineBusy = round2(w.busyS / w.allS)
	}
	w.Seconds = round2(w.Seconds)
}

// walLSN is the server's current write-ahead log position, in bytes.
func (b *pgBench) walLSN(ctx context.Context) (int64, error) {
	var n int64
	err := b.admin.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").Scan(&n)
	return n, err
}

// serverCPU is the CPU seconds used so far by the postmaster and its
// children (the connections' backends, the WAL writer, the checkpointer...).
func (b *pgBench) serverCPU() float64 {
	raw, err := os.ReadFile(filepath.Join(b.srv.DataDir(), "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(raw), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0
	}
	total, _ := procCPU(postmaster)
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if _, f, err := procStat(pid); err == nil && len(f) > 1 && f[1] == strconv.Itoa(postmaster) {
			sec, _ := procCPU(pid)
			total += sec
		}
	}
	return total
}

func selfCPU() float64 {
	sec, _ := procCPU(os.Getpid())
	return sec
}
