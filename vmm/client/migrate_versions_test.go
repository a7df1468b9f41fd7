package client

import (
	"errors"
	"strings"
	"testing"

	"tern/migration"
	"tern/vmm/api"
	"tern/vmm/instance"
)

func TestCheckMigrationVersions(t *testing.T) {
	cur := api.Version{MigrationProtocols: []migration.Version{1}, Devices: map[string][]uint16{"vcpu": {1}, "uart": {1}}}
	for _, c := range []struct {
		name     string
		src, dst api.Version
		want     []string // substrings of the error; none: compatible
	}{
		{"same build", cur, cur, nil},
		{"the target reads the source's version and the one before",
			cur, api.Version{MigrationProtocols: []migration.Version{1, 2}, Devices: map[string][]uint16{"vcpu": {1, 2}, "uart": {1}}}, nil},
		{"the source reads an older version but writes its newest",
			api.Version{MigrationProtocols: []migration.Version{1}, Devices: map[string][]uint16{"vcpu": {1, 2}}},
			api.Version{MigrationProtocols: []migration.Version{1}, Devices: map[string][]uint16{"vcpu": {2, 3}}}, nil},
		{"no common protocol",
			cur, api.Version{MigrationProtocols: []migration.Version{99}, Devices: cur.Devices},
			[]string{"no common migration protocol", "[1]", "[99]"}},
		{"a newer device version",
			api.Version{MigrationProtocols: []migration.Version{1}, Devices: map[string][]uint16{"vcpu": {1, 2}, "uart": {1}}}, cur,
			[]string{"device vcpu: the source writes version 2, the target reads [1]"}},
		{"an unknown kind and no protocol, both named",
			api.Version{MigrationProtocols: []migration.Version{2}, Devices: map[string][]uint16{"vcpu": {1}, "uart": {1}, "rtc": {1}}}, cur,
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
	snap := func(state instance.State, in, out *MigrationProgress) *MigrationSnapshot {
		s := &MigrationSnapshot{State: state}
		s.Migration.In, s.Migration.Out = in, out
		return s
	}
	at := func(p instance.Phase) *MigrationProgress { return &MigrationProgress{ID: id, Phase: p} }
	failed := func(reason string) *MigrationProgress {
		return &MigrationProgress{ID: id, Phase: instance.PhaseError, Error: reason}
	}
	for _, c := range []struct {
		name               string
		w                  migrationWatch
		done               bool
		errSide            Side
		errPhase, errWords string
	}{
		{name: "both migrating", w: migrationWatch{src: snap(instance.Migrating, nil, at(instance.PhaseRAMPush)), dst: snap(instance.Migrating, at(instance.PhaseRAMPush), nil)}},
		{name: "target runs, source not yet destroyed",
			w: migrationWatch{src: snap(instance.Migrating, nil, at(instance.PhaseFinish)), dst: snap(instance.Running, at(instance.PhaseFinish), nil)}},
		{name: "target runs and source destroyed", done: true,
			w: migrationWatch{src: snap(instance.Destroyed, nil, at(instance.PhaseFinish)), dst: snap(instance.Running, at(instance.PhaseFinish), nil)}},
		{name: "target runs and source gone", done: true,
			w: migrationWatch{srcGone: true, dst: snap(instance.Running, at(instance.PhaseFinish), nil)}},
		{name: "the source resumed with error", errSide: SideSource, errPhase: "device", errWords: "injected",
			w: migrationWatch{srcPhase: instance.PhaseDevice, src: snap(instance.Running, nil, failed("injected"))}},
		{name: "the target failed", errSide: SideTarget, errPhase: "ram_push", errWords: "no reason given",
			w: migrationWatch{dstPhase: instance.PhaseRAMPush, dst: snap(instance.Failed, at(instance.PhaseRAMPush), nil)}},
		{name: "another migration's error is not ours",
			w: migrationWatch{src: snap(instance.Running, nil, &MigrationProgress{ID: "mig-0", Phase: instance.PhaseError})}},
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
