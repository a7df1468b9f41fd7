// Package chaos runs tern's volume against real downstairs processes
// under faults: separate network hosts with impaired and cut links, a
// SIGKILL crash campaign, and a soak that watches for leaks.
package chaos
