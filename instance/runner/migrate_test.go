package runner

import (
	"errors"
	"strings"
	"testing"

	"tern/instance/apiv1"
)

func TestCheckMigrationVersions(t *testing.T) {
	cur := apiv1.Version{MigrationProtocols: []apiv1.MigrationVersion{1}, Devices: map[string][]uint16{"vcpu": {1}, "uart": {1}}}
	for _, c := range []struct {
		name     string
		src, dst apiv1.Version
		want     []string // substrings of the error; none: compatible
	}{
		{"same build", cur, cur, nil},
		{"the target reads the source's version and the one before",
			cur, apiv1.Version{MigrationProtocols: []apiv1.MigrationVersion{1, 2}, Devices: map[string][]uint16{"vcpu": {1, 2}, "uart": {1}}}, nil},
		{"the source reads an older version but writes its newest",
			apiv1.Version{MigrationProtocols: []apiv1.MigrationVersion{1}, Devices: map[string][]uint16{"vcpu": {1, 2}}},
			apiv1.Version{MigrationProtocols: []apiv1.MigrationVersion{1}, Devices: map[string][]uint16{"vcpu": {2, 3}}}, nil},
		{"no common protocol",
			cur, apiv1.Version{MigrationProtocols: []apiv1.MigrationVersion{99}, Devices: cur.Devices},
			[]string{"no common migration protocol", "[1]", "[99]"}},
		{"a newer device version",
			apiv1.Version{MigrationProtocols: []apiv1.MigrationVersion{1}, Devices: map[string][]uint16{"vcpu": {1, 2}, "uart": {1}}}, cur,
			[]string{"device vcpu: the source writes version 2, the target reads [1]"}},
		{"an unknown kind and no protocol, both named",
			apiv1.Version{MigrationProtocols: []apiv1.MigrationVersion{2}, Devices: map[string][]uint16{"vcpu": {1}, "uart": {1}, "rtc": {1}}}, cur,
			[]string{"no common migration protocol", "device rtc: the target does not read this kind"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := CheckMigrationVersions(c.src, c.dst)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("got %v; want compatible", err)
				}
				return
			}
			if !errors.Is(err, ErrIncompatible) {
				t.Fatalf("got %v; want ErrIncompatible", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
		})
	}
}

func TestMigrationWatchDecides(t *testing.T) {
	const id = "mig-1"
	snap := func(state apiv1.State, in, out apiv1.Progress) *apiv1.View {
		return &apiv1.View{State: state, Migration: apiv1.Migration{In: in, Out: out}}
	}
	none := apiv1.Progress{}
	at := func(p apiv1.Phase) apiv1.Progress { return apiv1.Progress{ID: id, Phase: p} }
	failed := func(reason string) apiv1.Progress {
		return apiv1.Progress{ID: id, Phase: apiv1.PhaseError, Error: reason}
	}
	for _, c := range []struct {
		name               string
		w                  migrationWatch
		done               bool
		errSide            Side
		errPhase, errWords string
	}{
		{name: "both migrating", w: migrationWatch{src: snap(apiv1.Migrating, none, at(apiv1.PhaseRAMPush)), dst: snap(apiv1.Migrating, at(apiv1.PhaseRAMPush), none)}},
		{name: "target runs, source not yet destroyed",
			w: migrationWatch{src: snap(apiv1.Migrating, none, at(apiv1.PhaseFinish)), dst: snap(apiv1.Running, at(apiv1.PhaseFinish), none)}},
		{name: "target runs and source destroyed", done: true,
			w: migrationWatch{src: snap(apiv1.Destroyed, none, at(apiv1.PhaseFinish)), dst: snap(apiv1.Running, at(apiv1.PhaseFinish), none)}},
		{name: "target runs and source gone", done: true,
			w: migrationWatch{srcGone: true, dst: snap(apiv1.Running, at(apiv1.PhaseFinish), none)}},
		{name: "the source resumed with error", errSide: SideSource, errPhase: "device", errWords: "injected",
			w: migrationWatch{srcPhase: apiv1.PhaseDevice, src: snap(apiv1.Running, none, failed("injected"))}},
		{name: "the target failed", errSide: SideTarget, errPhase: "ram_push", errWords: "no reason given",
			w: migrationWatch{dstPhase: apiv1.PhaseRAMPush, dst: snap(apiv1.Failed, at(apiv1.PhaseRAMPush), none)}},
		{name: "another migration's error is not ours",
			w: migrationWatch{src: snap(apiv1.Running, none, apiv1.Progress{ID: "mig-0", Phase: apiv1.PhaseError})}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.w.id = id
			done, err := c.w.decide()
			if done != c.done {
				t.Errorf("done = %v; want %v", done, c.done)
			}
			var me *MigrationError
			if c.errSide == "" {
				if err != nil {
					t.Errorf("err = %v; want none", err)
				}
				return
			}
			if !errors.As(err, &me) || me.Side != c.errSide || me.Phase.String() != c.errPhase || !strings.Contains(err.Error(), c.errWords) {
				t.Errorf("err = %v; want a %s failure in phase %s saying %q", err, c.errSide, c.errPhase, c.errWords)
			}
		})
	}
}
