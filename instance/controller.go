package instance

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync"

	"github.com/quic-go/quic-go"

	"tern/instance/apiv1"
	"tern/vmm/devices"
)

// Config is what Start needs besides the spec.
type Config struct {
	// Spec must have passed Validate.
	Spec apiv1.Spec
	// VolumeTLS is the client configuration a volume disk's upstairs
	// presents to its downstairs.
	VolumeTLS *tls.Config
	// NewMachine builds the VM; nil means NewVMMachine.
	NewMachine NewMachineFunc
	// Logger receives the controller's logs; nil discards them.
	Logger *slog.Logger
	// FirstGen is the gen of the first snapshot (0 means 1); see
	// NewPublisherAt.
	FirstGen apiv1.ViewGen
	// Host is what a migration target validates the spec it inherits
	// against.
	Host Host
	// MigrationTLS is the client configuration a migration target dials
	// its source with (mutual TLS; NextProtos is set here); nil refuses
	// migration in.
	MigrationTLS *tls.Config
	// MigrationVersions are the protocol versions offered either way
	// (nil: migration.SupportedVersions).
	MigrationVersions []apiv1.MigrationVersion
	// APIURL is this VMM's API, which a migration target sends its
	// source for the source's serial watchers.
	APIURL string
	// SameHostSocketPrefix is where a migration source makes its memfd
	// hand-over socket (migration.SourceConfig.SameHostSocketPrefix); empty
	// refuses the same-host path.
	SameHostSocketPrefix string
}

// Controller is one instance: the owner goroutine that builds its disks
// and VM and drives them through the states, the policy-guarded request
// entry point, and the publisher of its snapshots. Everything it builds
// is freed before it publishes destroyed or failed.
type Controller struct {
	// Immutable after Start.
	spec       apiv1.Spec
	volumeTLS  *tls.Config
	mig        migrationConfig
	newMachine NewMachineFunc
	log        *slog.Logger
	pub        *Publisher
	console    *devices.History
	// wake has one slot: Request fills it after enqueueing.
	wake chan struct{}
	// done is closed when the owner goroutine has ended and freed
	// everything.
	done chan struct{}

	mu sync.Mutex
	// state is the state last published; pending the requests enqueued
	// and not yet completed (the policy's input).
	state   apiv1.State
	pending Pending
	// disks are the opened disks, set once by the owner goroutine.
	disks []*disk
	// machine is the current VM, nil when there is none.
	machine Machine
	// failure is why the instance failed, if it did.
	failure error
	// stopReason is why the instance halted, once it does.
	stopReason string
	// built is the spec the instance is built from: spec, or for a
	// migration target the source's merged with the ensure's (set once
	// the source's is known); see BuiltSpec.
	built apiv1.Spec
	// outgoing is the connection of a migration out that the policy
	// enqueued and the owner goroutine has not taken yet.
	outgoing *quic.Conn
	// migratedTo is the target's API URL once a migration out finished.
	migratedTo string
}

// Failure returns why the instance failed; nil unless its state is failed.
func (c *Controller) Failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failure
}

// StopReason returns why the instance halted ("guest powered off",
// "stop requested", …); empty before it halts or if it failed.
func (c *Controller) StopReason() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopReason
}

// Start validates nothing (the caller did) and returns at once; the
// instance is built on its own goroutine. The first snapshot is gen 1,
// creating.
func Start(cfg Config) *Controller {
	c := &Controller{
		spec:       cfg.Spec,
		volumeTLS:  cfg.VolumeTLS,
		mig:        migrationConfigOf(cfg),
		newMachine: cfg.NewMachine,
		log:        cfg.Logger,
		console:    devices.NewHistory(consoleHistoryBytes),
		wake:       make(chan struct{}, 1),
		done:       make(chan struct{}),
		state:      apiv1.Creating,
		built:      cfg.Spec,
	}
	if cfg.Spec.Init.Method == apiv1.InitMigrationTarget {
		// Born migrating in (the policy's migrate_in row): the built spec
		// is known once the source sent its own.
		c.state, c.pending, c.built = apiv1.Migrating, PendingOf(apiv1.MigrateIn), apiv1.Spec{}
		c.pub = NewPublisherAt(cfg.FirstGen, apiv1.Migrating, apiv1.Migration{In: apiv1.Progress{ID: cfg.Spec.Init.MigrationID, Phase: apiv1.PhaseSync}})
	} else {
		c.pub = NewPublisherAt(cfg.FirstGen, apiv1.Creating, apiv1.Migration{})
	}
	if c.newMachine == nil {
		c.newMachine = NewVMMachine
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.log = c.log.With("component", "instance", "instance_id", cfg.Spec.ID)
	go c.run()
	return c
}

// Spec returns the spec the instance was ensured with.
func (c *Controller) Spec() apiv1.Spec { return c.spec }

// BuiltSpec returns the spec the instance is built from: the ensured one,
// or for a migration target the source's with the ensure's disks and
// components, once the source sent it (until then the ensured one).
func (c *Controller) BuiltSpec() apiv1.Spec {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.built.ID == "" {
		return c.spec
	}
	return c.built
}

// MigratedTo returns the API URL of the VMM the instance migrated to,
// once a migration out finished; empty otherwise.
func (c *Controller) MigratedTo() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.migratedTo
}

// Publisher returns the instance's snapshot publisher.
func (c *Controller) Publisher() *Publisher { return c.pub }

// Done is closed once the instance is destroyed or failed and everything
// it built is freed.
func (c *Controller) Done() <-chan struct{} { return c.done }

// Console is the instance's serial output history, kept across reboots
// and after the instance is gone.
func (c *Controller) Console() *devices.History { return c.console }

// SerialInput queues p for the guest's UART and returns how many bytes
// were taken: none when no VM exists.
func (c *Controller) SerialInput(p []byte) int {
	c.mu.Lock()
	m := c.machine
	c.mu.Unlock()
	if m == nil {
		return 0
	}
	return m.SerialInput(p)
}

// Request judges req with the policy (Decide) and, when it is enqueued,
// hands it to the owner goroutine. A denied request returns the
// Decision's *WrongStateError.
func (c *Controller) Request(req apiv1.Request) (Decision, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, p := Decide(c.state, c.pending, req)
	if err := d.Err(c.state, req); err != nil {
		return d, err
	}
	c.pending = p
	if d.Disposition == Enqueue {
		select {
		case c.wake <- struct{}{}:
		default: // a wake-up is already due
		}
	}
	return d, nil
}

// Disks describes every disk, in spec order; before the owner goroutine
// opened them each is "opening".
func (c *Controller) Disks() []apiv1.DiskStatus {
	c.mu.Lock()
	disks, specs := c.disks, c.built.Disks
	c.mu.Unlock()
	out := make([]apiv1.DiskStatus, 0, len(specs))
	for i, ds := range specs {
		if i < len(disks) {
			out = append(out, disks[i].status(false))
			continue
		}
		out = append(out, apiv1.DiskStatus{Name: ds.Name, Kind: ds.Backend.Kind, State: apiv1.DiskOpening})
	}
	return out
}

// Disk describes one disk with its replicas; ok is false when the spec
// has no disk of that name.
func (c *Controller) Disk(name string) (apiv1.DiskStatus, bool) {
	c.mu.Lock()
	disks, specs := c.disks, c.built.Disks
	c.mu.Unlock()
	for i, ds := range specs {
		if ds.Name != name {
			continue
		}
		if i < len(disks) {
			return disks[i].status(true), true
		}
		return apiv1.DiskStatus{Name: ds.Name, Kind: ds.Backend.Kind, State: apiv1.DiskOpening}, true
	}
	return apiv1.DiskStatus{}, false
}

// publish moves to state s, with complete removed from Pending, as one
// snapshot.
func (c *Controller) publish(s apiv1.State, complete ...apiv1.Request) {
	c.publishWith(s, nil, complete...)
}

// publishWith is publish that also applies update (may be nil) to the
// snapshot: a state and a migration status change in one generation.
func (c *Controller) publishWith(s apiv1.State, update func(*apiv1.View), complete ...apiv1.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state = s
	for _, r := range complete {
		c.pending = c.pending.Completed(r)
	}
	if !Consistent(s, c.pending) {
		// The owner goroutine broke the Pending contract: a bug here,
		// never an input from outside.
		panic(fmt.Sprintf("instance: inconsistent state %s with %s pending", s, c.pending))
	}
	if _, err := c.pub.Publish(func(snap *apiv1.View) {
		snap.State = s
		if update != nil {
			update(snap)
		}
	}); err != nil {
		c.log.Error("publishing state", "state", s, "err", err)
	}
	c.log.Info("instance state", "state", s.String(), "gen", c.pub.Current().Gen, "pending", c.pending.String())
}

// current returns the state and pending requests.
func (c *Controller) current() (apiv1.State, Pending) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state, c.pending
}
