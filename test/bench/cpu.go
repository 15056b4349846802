package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is Linux's USER_HZ, the unit of utime and stime in /proc/<pid>/stat
// (100 on every architecture Go's linux ports use).
const clockTicks = 100

// cpuSample is the CPU time used so far, in seconds, by each of this
// process's children by command name (kube-apiserver, etcd, manager), by
// this process ("bench": the clients, and the operator with -in-process),
// and by the whole machine (busy and total, from /proc/stat).
type cpuSample struct {
	byProcess               map[string]float64
	machineBusy, machineAll float64
}

func sampleCPU() cpuSample {
	s := cpuSample{byProcess: map[string]float64{}}
	for pid, comm := range children() {
		if sec, err := procCPU(pid); err == nil {
			s.byProcess[comm] += sec
		}
	}
	if sec, err := procCPU(os.Getpid()); err == nil {
		s.byProcess["bench"] += sec
	}
	s.machineBusy, s.machineAll = machineCPU()
	return s
}

// procStat reads /proc/<pid>/stat: the command name, and the fields after
// it (state, ppid, pgrp, session, tty, tpgid, flags, minflt, cminflt,
// majflt, cmajflt, utime, stime, ...).
func procStat(pid int) (string, []string, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", nil, err
	}
	s := string(stat)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	return s[open+1 : closing], strings.Fields(s[closing+1:]), nil
}

// procCPU is utime+stime of pid, in seconds.
func procCPU(pid int) (float64, error) {
	_, f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	k, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return (u + k) / clockTicks, nil
}

// machineCPU is the machine's busy and total CPU seconds from the first line
// of /proc/stat (idle and iowait count as not busy).
func machineCPU() (busy, all float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || i >= 8 { // guest time is already counted in user
			continue
		}
		all += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy / clockTicks, all / clockTicks
}
