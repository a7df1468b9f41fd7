// Command linuxinit is the /init of the Linux boot tests' initramfs. It
// prints what the kernel found of the machine (the online CPUs, after
// cpusPrefix, and the ACPI tables, after acpiPrefix), then initLine on the
// console, then waits for one line of console input, prints it back after
// echoPrefix and exits with status 0 through tern's debug-exit port
// (0xf4), which ends the VM's Run; the lines "poweroff" and "reboot"
// instead power the machine off or reboot it through the kernel. Built
// with CGO_ENABLED=0, so it is static.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The lines it prints; package linuxtest, which the tests read them from,
// has the same.
const (
	initLine   = "tern-linux-init: hello"
	echoPrefix = "tern-linux-init: echo "
	cpusPrefix = "tern-linux-init: cpus online "
	acpiPrefix = "tern-linux-init: acpi tables "
)

// debugExitPort is where tern's guests write their exit status.
const debugExitPort = 0xf4

func main() {
	// The initramfs has an empty /dev; the nodes come with devtmpfs.
	_ = syscall.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	c, err := os.OpenFile("/dev/console", os.O_RDWR, 0)
	console = c
	if err != nil {
		fmt.Println("tern-linux-init: opening /dev/console:", err) // the kernel's console, if any
		exit(1)
	}
	printMachine(c)
	fmt.Fprintln(c, initLine)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Fprintln(c, "tern-linux-init: reading the console:", err)
		exit(2)
	}
	line = strings.TrimSpace(line)
	fmt.Fprintf(c, "%s%s\n", echoPrefix, line)
	switch line {
	case "poweroff", "reboot":
		// The kernel's own way out: ACPI S5 or the ACPI reset register.
		end(line)
	}
	exit(0)
}

// end powers the machine off or reboots it with the reboot system call,
// as busybox's poweroff -f and reboot -f do, after the console drained.
func end(how string) {
	drain(console)
	syscall.Sync()
	cmd := syscall.LINUX_REBOOT_CMD_POWER_OFF
	if how == "reboot" {
		cmd = syscall.LINUX_REBOOT_CMD_RESTART
	}
	err := syscall.Reboot(cmd)
	fmt.Fprintf(console, "tern-linux-init: %s: %v\n", how, err)
	exit(3)
}

// printMachine prints the CPUs the kernel brought online (the
// cpulist of /sys/devices/system/cpu/online, such as "0-1") and the ACPI
// tables it found (the names in /sys/firmware/acpi/tables), or why not.
func printMachine(c *os.File) {
	if err := os.MkdirAll("/sys", 0o755); err == nil {
		err = syscall.Mount("sysfs", "/sys", "sysfs", 0, "")
		if err != nil {
			fmt.Fprintln(c, "tern-linux-init: mounting sysfs:", err)
		}
	}
	online, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		fmt.Fprintf(c, "%s(%v)\n", cpusPrefix, err)
	} else {
		fmt.Fprintf(c, "%s%s\n", cpusPrefix, strings.TrimSpace(string(online)))
	}
	var names []string
	entries, err := os.ReadDir("/sys/firmware/acpi/tables")
	for _, e := range entries {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	if err != nil {
		names = append(names, "("+err.Error()+")")
	}
	fmt.Fprintf(c, "%s%s\n", acpiPrefix, strings.Join(names, " "))
}

// console is /dev/console once open.
var console *os.File

// exit waits for the console to send what was written to it, writes
// status to the debug-exit port through /dev/port and, where that does
// not end the machine, powers it off. The port write stops every vCPU at
// once, so without the wait the UART's interrupt-driven transmission of
// the last lines would be cut short (the echo line was seen cut after 16
// bytes, the UART's FIFO, in about one boot in three with two vCPUs).
func exit(status byte) {
	if console != nil {
		drain(console)
	}
	syscall.Sync()
	if p, err := os.OpenFile("/dev/port", os.O_WRONLY, 0); err == nil {
		p.WriteAt([]byte{status}, debugExitPort)
		p.Close()
	}
	_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	select {} // init must not exit
}

// drain waits until the terminal has sent its output (tcdrain: TCSBRK
// with a non-zero argument sends no break), as the emulated host's init
// does (internal/kvmhost).
func drain(f *os.File) {
	if err := unix.IoctlSetInt(int(f.Fd()), unix.TCSBRK, 1); err != nil {
		fmt.Fprintln(f, "tern-linux-init: draining the console:", err)
	}
}
