package multihost

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"tern/control/controlapi"

	"tern/agent/agentapi"
	"tern/control"
	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/vmm/kvm/kvmtest"
)

// TestSIGKILLOfControlAtEachSagaStepEndsConsistent kills tern control
// right after each migration saga step acted (before it was recorded
// done), restarts it, and checks the migration ends completed or failed
// with the instance on exactly one running vmm, from the agents'
// reports, and that it never ran on two.
func TestSIGKILLOfControlAtEachSagaStepEndsConsistent(t *testing.T) {
	for _, step := range emulatedSubset(t, control.StepNames(), "create_vmm_record", "ensure_target", "mark_in_progress") {
		t.Run(step, func(t *testing.T) {
			c := newCluster(t, "TERN_CONTROL_CRASH_AT=after:"+step)
			v := c.createDirty("k1")
			from, _ := c.waitRunning("k1")
			// The migrate call dies with the control process.
			c.ctl(nil, "instance", "migrate", "k1", "--to", c.otherHost(from))
			select {
			case <-c.control.Exited:
			case <-time.After(generous):
				t.Fatal("tern control did not die at the crash point")
			}
			c.control.Reaped()
			c.startControl()
			for _, m := range c.migrationsOf(v.ID) {
				c.waitMigrationEnd(m.ID)
			}
			host, url := c.settled(v.ID)
			if host == "" {
				t.Fatal("the instance was left on no vmm; a control crash alone must not lose it")
			}
			waitVerifyPass(t, url, "after the crash at "+step)
			c.neverTwoRunning()
		})
	}
}

// vmmPIDs lists the `tern vmm serve` children of process pid.
func vmmPIDs(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		dir := filepath.Dir(p)
		cmdline, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		if strings.Contains(string(cmdline), "vmm\x00serve\x00") {
			c, _ := strconv.Atoi(filepath.Base(dir))
			out = append(out, c)
		}
	}
	return out
}

// TestSIGKILLMidMigrationEndsByTheRules SIGKILLs, while a migration
// runs, the source's or the target's agent (its vmms die with it; it is
// started again) or vmm, and checks that the migration ends, that the
// records agree with what the agents report (the instance on the one vmm
// that runs, or failed on none), that it never ran on two vmms, and that
// a guest left running still verifies.
func TestSIGKILLMidMigrationEndsByTheRules(t *testing.T) {
	type killCase struct {
		name      string
		source    bool // the source's side, else the target's
		wholeHost bool // the agent, else the vmm
		// survives is whether the instance must keep running: a
		// target lost before it ran leaves the source to resume.
		survives bool
	}
	cases := map[string]killCase{}
	var names []string
	for _, tc := range []killCase{
		{"source agent", true, true, false},
		{"target agent", false, true, true},
		{"source vmm", true, false, false},
		{"target vmm", false, false, true},
	} {
		cases[tc.name] = tc
		names = append(names, tc.name)
	}
	for _, name := range emulatedSubset(t, names, "target agent", "source vmm") {
		tc := cases[name]
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			v := c.createDirty("m1")
			from, srcURL := c.waitRunning("m1")
			to := c.otherHost(from)
			src, err := client.New(srcURL, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), generous)
			defer cancel()
			s, err := src.Monitor(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			migrated := make(chan error, 1)
			go func() { migrated <- c.ctl(nil, "instance", "migrate", "m1", "--to", to) }()
			// Mid-migration: the source reports the migration out.
			s, err = src.WaitFor(ctx, s.Gen, func(s apiv1.View) bool { return s.Migration.Out.Active() })
			if err != nil {
				t.Fatalf("waiting for the migration to start: %v", err)
			}
			t.Logf("killing at the source's phase %v", s.Migration.Out.Phase)
			if s.Migration.Out.Phase == apiv1.PhaseFinish {
				t.Log("the migration reached its last phase before the kill")
			}
			host := to
			if tc.source {
				host = from
			}
			if tc.wholeHost {
				c.restartAgent(host)
			} else {
				pids := vmmPIDs(c.agent(host).Cmd.Process.Pid)
				if len(pids) != 1 {
					t.Fatalf("host %s's agent runs vmms %v, want the migration's one", host, pids)
				}
				if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
					t.Fatal(err)
				}
			}
			select {
			case <-migrated: // completed or failed: the records say which
			case <-time.After(generous):
				t.Fatal("tern ctl instance migrate never returned")
			}
			migs := c.migrationsOf(v.ID)
			if len(migs) != 1 {
				t.Fatalf("migrations %+v, want one", migs)
			}
			m := c.waitMigrationEnd(migs[0].ID)
			h, url := c.settled(v.ID)
			t.Logf("migration %s, error %q; the instance runs on %q", m.State, m.Error, h)
			switch {
			case m.State == controlapi.MigrationCompleted && h != to:
				t.Fatalf("the migration completed but the instance is on %q, not the target %s", h, to)
			case m.State == controlapi.MigrationFailed && h != "" && h != from:
				t.Fatalf("the migration failed but the instance is on %q, not the source %s", h, from)
			case tc.survives && h == "":
				t.Fatal("the source lived, yet the instance was left on no vmm")
			}
			if url != "" {
				waitVerifyPass(t, url, "after the kill")
			}
			c.neverTwoRunning()
			// The restarted agent runs no vmm of the instance unless it
			// is the one the records name.
			inv := c.waitAgents("the agents", func(map[string]agentapi.Inventory) bool { return true })
			if vs := vmmsOf(inv, v.ID); len(vs) > 1 {
				t.Fatalf("instance %s has vmms %+v left", v.ID, vs)
			}
		})
	}
}

// emulatedSubset returns all, or inside the emulated test host (where
// every cluster and migration costs ten times as much) only the cases
// named in subset, saying which it leaves to the runs on /dev/kvm: each
// case drives the same production code either way, and the subset keeps
// one of each kind.
func emulatedSubset(t *testing.T, all []string, subset ...string) []string {
	t.Helper()
	for _, s := range subset {
		if !slices.Contains(all, s) {
			t.Fatalf("emulatedSubset: %q is not a case (have %v)", s, all)
		}
	}
	picked := kvmtest.Sized(all, subset)
	if len(picked) < len(all) {
		var left []string
		for _, a := range all {
			if !slices.Contains(picked, a) {
				left = append(left, a)
			}
		}
		t.Logf("inside the emulated test host: running %v; %v run where /dev/kvm is usable", picked, left)
	}
	return picked
}
