package instance

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"tern/instance/apiv1"
	"tern/migration"
	"tern/vmm"
)

// runResult is what a machine's Run returned.
type runResult struct {
	status uint32
	err    error
}

// driver is the owner goroutine's own state; nothing else touches it.
type driver struct {
	c *Controller
	// ctx is cancelled when the instance halts: it aborts activation and
	// ends Run.
	ctx    context.Context
	cancel context.CancelFunc
	disks  []*disk
	// activations are the volume activation goroutines.
	activations sync.WaitGroup
	machine     Machine
	// runDone delivers Run's result; nil while no machine runs.
	runDone chan runResult
	pump    *consolePump
	// inj is the instance's migration failure injector, made on first
	// use; its counts span migrations.
	inj *migration.Injector
}

// run is the owner goroutine: it builds the instance, then carries out
// requests and reacts to activation and the guest until it halts.
func (c *Controller) run() {
	defer close(c.done)
	d := &driver{c: c}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	defer d.cancel()
	if c.spec.Init.Method == apiv1.InitMigrationTarget {
		st, err := d.migrateIn()
		switch {
		case err != nil && c.pendingNow().Has(apiv1.Stop):
			// Stopped on purpose: the import is abandoned, not failed.
			d.haltWith("stop requested during the migration in", func(s *apiv1.View) { s.Migration.In = st })
			return
		case err != nil:
			d.failWith(err, func(s *apiv1.View) { s.Migration.In = st })
			return
		}
		c.publishWith(apiv1.Running, func(s *apiv1.View) { s.Migration.In = st }, apiv1.MigrateIn)
	} else if err := d.create(); err != nil {
		d.fail(err)
		return
	}
	for {
		st, p := c.current()
		if p.Has(apiv1.Stop) {
			d.halt("stop requested")
			return
		}
		if err := d.activationError(); err != nil {
			d.fail(err)
			return
		}
		act := d.nextActivation()
		switch {
		case st == apiv1.Creating && p.Has(apiv1.Run):
			c.publish(apiv1.Starting)
			continue
		case st == apiv1.Starting && act == nil:
			d.startMachine()
			c.publish(apiv1.Running, apiv1.Run)
			continue
		case st == apiv1.Running && p.Has(apiv1.MigrateOut):
			if d.migrateOut() {
				d.halt("migrated out")
				return
			}
			continue
		case st == apiv1.Running && p.Has(apiv1.Reboot):
			if err := d.reboot(); err != nil {
				d.fail(err)
				return
			}
			continue
		}
		select {
		case <-c.wake:
		case <-act:
		case r := <-d.runDone:
			d.runDone = nil
			switch {
			case errors.Is(r.err, vmm.ErrGuestReset):
				// The guest rebooted: a fresh VM over the same disks,
				// as a requested reboot gets.
				c.log.Info("guest reset the machine; rebooting the instance")
				if err := d.reboot(); err != nil {
					d.fail(err)
					return
				}
				continue
			case errors.Is(r.err, vmm.ErrPoweredOff):
				d.halt("guest powered off")
			case r.err != nil:
				d.fail(fmt.Errorf("running VM: %w", r.err))
			default:
				d.halt(fmt.Sprintf("guest exited with status %d", r.status))
			}
			return
		}
	}
}

// create opens the disks, starts volume activation in the background and
// builds the VM. A stop requested meanwhile is seen right after.
func (d *driver) create() error {
	c := d.c
	for _, ds := range c.spec.Disks {
		dk, err := openDisk(ds, c.volumeTLS, c.log)
		if err != nil {
			return err
		}
		d.disks = append(d.disks, dk)
		if dk.up != nil {
			d.activations.Go(func() { dk.activate(d.ctx) })
		}
	}
	c.mu.Lock()
	c.disks = d.disks
	c.mu.Unlock()
	if p := c.pendingNow(); p.Has(apiv1.Stop) {
		return nil // halt follows; do not build memory for nothing
	}
	return d.buildMachine()
}

// buildMachine creates a VM over the disks.
func (d *driver) buildMachine() error {
	cfg := MachineConfig{Spec: d.c.spec, Logger: d.c.log}
	for _, dk := range d.disks {
		cfg.Disks = append(cfg.Disks, dk.backend)
	}
	m, err := d.c.newMachine(cfg)
	if err != nil {
		return err
	}
	d.machine = m
	d.c.mu.Lock()
	d.c.machine = m
	d.c.mu.Unlock()
	return nil
}

// startMachine runs the VM on a goroutine the driver waits for.
func (d *driver) startMachine() {
	m := d.machine
	d.pump = startConsolePump(m.SerialOutput(), d.c.console)
	done := make(chan runResult, 1)
	go func() {
		s, err := m.Run(d.ctx)
		done <- runResult{s, err}
	}()
	d.runDone = done
}

// stopMachine stops and frees the VM, waiting for Run and the console pump.
func (d *driver) stopMachine() error {
	if d.machine == nil {
		return nil
	}
	d.machine.Stop()
	if d.runDone != nil {
		<-d.runDone
		d.runDone = nil
	}
	if d.pump != nil {
		d.pump.stop()
		d.pump = nil
	}
	d.c.mu.Lock()
	d.c.machine = nil
	d.c.mu.Unlock()
	err := d.machine.Close()
	d.machine = nil
	return err
}

// reboot replaces the VM with a fresh one over the same disks: the guest
// starts again from its entry with its devices reset.
func (d *driver) reboot() error {
	d.c.publish(apiv1.Rebooting)
	if err := d.stopMachine(); err != nil {
		return err
	}
	if err := d.buildMachine(); err != nil {
		return err
	}
	d.startMachine()
	d.c.publish(apiv1.Running, apiv1.Reboot)
	return nil
}

// nextActivation returns the channel of a volume activation still
// running, or nil when none is.
func (d *driver) nextActivation() <-chan struct{} {
	for _, dk := range d.disks {
		if dk.activated == nil {
			continue
		}
		select {
		case <-dk.activated:
		default:
			return dk.activated
		}
	}
	return nil
}

// activationError is the first failed activation's error.
func (d *driver) activationError() error {
	for _, dk := range d.disks {
		if dk.activated == nil {
			continue
		}
		select {
		case <-dk.activated:
			if err := dk.activationErr(); err != nil {
				return fmt.Errorf("activating disk %s: %w", dk.spec.Name, err)
			}
		default:
		}
	}
	return nil
}

// teardown frees everything: activation is aborted, the VM stopped and
// closed, the disks closed.
func (d *driver) teardown() error {
	d.cancel()
	errs := []error{d.stopMachine()}
	d.activations.Wait()
	for _, dk := range d.disks {
		errs = append(errs, dk.close())
	}
	return errors.Join(errs...)
}

// halt stops the instance: stopping, everything freed, stopped, then
// destroyed, and the publisher closed.
func (d *driver) halt(why string) { d.haltWith(why, nil) }

// haltWith is halt that also applies update (may be nil) to the stopping
// snapshot.
func (d *driver) haltWith(why string, update func(*apiv1.View)) {
	c := d.c
	c.log.Info("instance halting", "reason", why)
	c.mu.Lock()
	c.stopReason = why
	c.mu.Unlock()
	c.publishWith(apiv1.Stopping, update, apiv1.Run, apiv1.Reboot, apiv1.MigrateOut, apiv1.MigrateIn)
	c.dropOutgoing("the instance is stopping")
	if err := d.teardown(); err != nil {
		c.log.Error("freeing instance", "err", err)
	}
	c.publish(apiv1.Stopped, apiv1.Stop)
	c.publish(apiv1.Destroyed)
	c.pub.Close()
}

// fail frees everything and ends in failed.
func (d *driver) fail(err error) { d.failWith(err, nil) }

// failWith is fail that also applies update (may be nil) to the failed
// snapshot.
func (d *driver) failWith(err error, update func(*apiv1.View)) {
	c := d.c
	c.log.Error("instance failed", "err", err)
	c.mu.Lock()
	c.failure = err
	c.mu.Unlock()
	if terr := d.teardown(); terr != nil {
		c.log.Error("freeing instance", "err", terr)
	}
	c.publishWith(apiv1.Failed, update, apiv1.AllRequests()...)
	c.dropOutgoing("the instance has failed")
	c.pub.Close()
}

// pendingNow returns the pending requests.
func (c *Controller) pendingNow() Pending {
	_, p := c.current()
	return p
}
