// Package child starts the processes tern runs beside itself (a vmm, a
// downstairs, a control plane, an agent), reaps them, and waits for the
// line each prints once it is ready, such as "listening on URL".
//
// A child is started from a goroutine locked to its OS thread, which
// stays locked until the child was reaped: Pdeathsig fires when the
// forking thread ends, so it kills the child when this process dies and
// never earlier. Each child gets its own process group, so a terminal's
// ^C reaches the parent alone, which stops its children in order.
package child
