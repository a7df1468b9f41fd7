package kvmhost

// The protocol between the host side (Exec) and the init inside.
const (
	// InitEnv is set on the guest kernel's command line, which passes it to
	// /init: together with pid 1 it tells a kvmhost-using executable to act
	// as the emulated host's init.
	InitEnv = "TERN_KVMHOST_INIT"
	// InsideEnv is set to "1" in the environment of the binary run inside.
	InsideEnv = "TERN_KVMHOST_INSIDE"

	// runSpecPath is the run description in the initramfs.
	runSpecPath = "/kvmhost/run.json"
	// initPath is where a copy of the init executable goes when it is not
	// the binary being run.
	initExePath = "/kvmhost/init"

	// Serial ports as the guest names them: the binary's stdout, its
	// stderr, and the console (kernel messages and init's status lines).
	stdoutTTY  = "/dev/ttyS0"
	stderrTTY  = "/dev/ttyS1"
	consoleTTY = "/dev/ttyS2"

	// statusPrefix starts init's last console line: the binary's exit
	// status follows in decimal.
	statusPrefix = "kvmhost-init: exit-status "
	// errorPrefix starts a console line on which init reports why it could
	// not run the binary.
	errorPrefix = "kvmhost-init: error: "
	// heartbeatPrefix starts the line init prints on the console every
	// heartbeatEvery while the binary runs: a machine that stops printing
	// it has stopped (see stallLimit).
	heartbeatPrefix = "kvmhost-init: heartbeat "
	// startedLine is init's console line right before it starts the
	// binary: a machine silent until then failed on its own.
	startedLine = "kvmhost-init: starting the binary"
)

// runSpec is what init runs, written by Exec as JSON at runSpecPath.
type runSpec struct {
	// Path is the binary's path inside.
	Path string `json:"path"`
	// Argv is the full argument vector, argv[0] included.
	Argv []string `json:"argv"`
	// Env is the binary's environment.
	Env []string `json:"env"`
	// Dir is the working directory, created inside.
	Dir string `json:"dir"`
	// Network asks init to configure eth0 (Options.Network).
	Network bool `json:"network,omitempty"`
}
