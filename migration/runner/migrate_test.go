package runner

import (
	"errors"
	"strings"
	"testing"

	"tern/instance"
	"tern/instance/api"
	"tern/migration"
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
	snap := func(state instance.State, in, out migration.Progress) *instance.Snapshot {
		return &instance.Snapshot{State: state, Migration: instance.Migration{In: in, Out: out}}
	}
	none := migration.Progress{}
	at := func(p migration.Phase) migration.Progress { return migration.Progress{ID: id, Phase: p} }
	failed := func(reason string) migration.Progress {
		return migration.Progress{ID: id, Phase: migration.PhaseError, Error: reason}
	}
	for _, c := range []struct {
		name               string
		w                  migrationWatch
		done               bool
		errSide            Side
		errPhase, errWords string
	}{
		{name: "both migrating", w: migrationWatch{src: snap(instance.Migrating, none, at(migration.PhaseRAMPush)), dst: snap(instance.Migrating, at(migration.PhaseRAMPush), none)}},
		{name: "target runs, source not yet destroyed",
			w: migrationWatch{src: snap(instance.Migrating, none, at(migration.PhaseFinish)), dst: snap(instance.Running, at(migration.PhaseFinish), none)}},
		{name: "target runs and source destroyed", done: true,
			w: migrationWatch{src: snap(instance.Destroyed, none, at(migration.PhaseFinish)), dst: snap(instance.Running, at(migration.PhaseFinish), none)}},
		{name: "target runs and source gone", done: true,
			w: migrationWatch{srcGone: true, dst: snap(instance.Running, at(migration.PhaseFinish), none)}},
		{name: "the source resumed with error", errSide: SideSource, errPhase: "device", errWords: "injected",
			w: migrationWatch{srcPhase: migration.PhaseDevice, src: snap(instance.Running, none, failed("injected"))}},
		{name: "the target failed", errSide: SideTarget, errPhase: "ram_push", errWords: "no reason given",
			w: migrationWatch{dstPhase: migration.PhaseRAMPush, dst: snap(instance.Failed, at(migration.PhaseRAMPush), none)}},
		{name: "another migration's error is not ours",
			w: migrationWatch{src: snap(instance.Running, none, migration.Progress{ID: "mig-0", Phase: migration.PhaseError})}},
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
