package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// userHZ is the unit of /proc's CPU times (USER_HZ, 100 on every Linux we run on).
const userHZ = 100

// machine describes where the numbers were measured.
type machine struct {
	Hostname       string `json:"hostname"`
	CPUs           int    `json:"cpus"`
	CPUModel       string `json:"cpu_model"`
	MemTotalMB     int64  `json:"mem_total_mb"`
	Kernel         string `json:"kernel"`
	HarnessGo      string `json:"harness_go"`
	GauntletGo     string `json:"gauntlet_go"`
	GauntletBinary string `json:"gauntlet_binary"`
	ClickHouse     string `json:"clickhouse_version"`
}

func describeMachine(ctx context.Context, gauntlet string, conn driver.Conn) machine {
	m := machine{CPUs: runtime.NumCPU(), HarnessGo: runtime.Version(), GauntletBinary: gauntlet}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if kb, err := parseStatusKB(b, "MemTotal"); err == nil {
			m.MemTotalMB = kb / 1024
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if bi, err := buildinfo.ReadFile(gauntlet); err == nil {
		m.GauntletGo = bi.GoVersion
		for _, s := range bi.Settings {
			if s.Key == "-ldflags" {
				m.GauntletGo += " (" + s.Value + ")"
			}
		}
	}
	if conn != nil {
		var v string
		if err := conn.QueryRow(ctx, "SELECT version()").Scan(&v); err == nil {
			m.ClickHouse = v
		}
	}
	return m
}

func readLoadAvg() loadAvg {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return loadAvg{}
	}
	l, _ := parseLoadAvg(b)
	return l
}

func readCPUTicks() cpuTicks {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTicks{}
	}
	t, _ := parseCPUTicks(b)
	return t
}

// procTicks returns a process's CPU time in ticks; 0 if it cannot be read.
func procTicks(pid int) uint64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	t, _ := parseProcStatTicks(b)
	return t
}

// procRSSKB returns a process's VmRSS in kB.
func procRSSKB(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	return parseStatusKB(b, "VmRSS")
}

// procSet names the processes whose CPU a window accounts for besides the measured one.
type procSet struct {
	ClickHouse func() int // the ClickHouse server's pid
}

// window is the wall time, load and CPU use of the machine during one measurement, so a
// reader can tell a slow round from a busy machine. CPU is in cores (1.0 = one core busy
// for the whole window); Others is what neither ClickHouse, this harness nor the measured
// child used: other people's work.
type window struct {
	Seconds      float64 `json:"seconds"`
	LoadStart    loadAvg `json:"load_start"`
	LoadEnd      loadAvg `json:"load_end"`
	BusyCores    float64 `json:"busy_cores"`
	ChildCores   float64 `json:"child_cores,omitempty"`
	CHCores      float64 `json:"clickhouse_cores"`
	HarnessCores float64 `json:"harness_cores"`
	OtherCores   float64 `json:"other_cores"`

	t0         time.Time
	cpu0       cpuTicks
	ch0, self0 uint64
	procs      procSet
}

func startWindow(procs procSet) *window {
	w := &window{procs: procs, t0: time.Now(), LoadStart: readLoadAvg(), cpu0: readCPUTicks(), self0: procTicks(os.Getpid())}
	w.ch0 = procTicks(procs.ClickHouse())
	return w
}

// end closes the window; childCPU is the measured child's CPU time within it (0: none).
func (w *window) endWith(childCPU time.Duration) window {
	out := *w
	out.Seconds = time.Since(w.t0).Seconds()
	out.LoadEnd = readLoadAvg()
	cpu := readCPUTicks()
	cores := func(ticks uint64) float64 { return float64(ticks) / userHZ / out.Seconds }
	out.BusyCores = cores(since(cpu.Busy, w.cpu0.Busy))
	out.CHCores = cores(since(procTicks(w.procs.ClickHouse()), w.ch0))
	out.HarnessCores = cores(since(procTicks(os.Getpid()), w.self0))
	out.ChildCores = childCPU.Seconds() / out.Seconds
	out.OtherCores = max(0, out.BusyCores-out.CHCores-out.HarnessCores-out.ChildCores)
	return out
}

func (w *window) end() window { return w.endWith(0) }

func (w window) String() string {
	s := fmt.Sprintf("load %s -> %s; cpu busy %.2f cores (clickhouse %.2f, harness %.2f", w.LoadStart, w.LoadEnd, w.BusyCores, w.CHCores, w.HarnessCores)
	if w.ChildCores > 0 {
		s += fmt.Sprintf(", gauntlet %.2f", w.ChildCores)
	}
	return s + fmt.Sprintf(", others %.2f)", w.OtherCores)
}

// since is now-then for counters that only grow; 0 if a reading failed.
func since(now, then uint64) uint64 {
	if now < then {
		return 0
	}
	return now - then
}
