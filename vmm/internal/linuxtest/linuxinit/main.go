// Command linuxinit is the /init of the Linux boot tests' initramfs. It
// prints initLine on the console, then waits for one line of console
// input, prints it back after echoPrefix and exits with status 0 through
// tern's debug-exit port (0xf4), which ends the VM's Run. Built with
// CGO_ENABLED=0, so it is static.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// The lines it prints; package linuxtest, which the tests read them from,
// has the same.
const (
	initLine   = "tern-linux-init: hello"
	echoPrefix = "tern-linux-init: echo "
)

// debugExitPort is where tern's guests write their exit status.
const debugExitPort = 0xf4

func main() {
	// The initramfs has an empty /dev; the nodes come with devtmpfs.
	_ = syscall.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	c, err := os.OpenFile("/dev/console", os.O_RDWR, 0)
	if err != nil {
		fmt.Println("tern-linux-init: opening /dev/console:", err) // the kernel's console, if any
		exit(1)
	}
	fmt.Fprintln(c, initLine)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Fprintln(c, "tern-linux-init: reading the console:", err)
		exit(2)
	}
	fmt.Fprintf(c, "%s%s\n", echoPrefix, strings.TrimSpace(line))
	exit(0)
}

// exit writes status to the debug-exit port through /dev/port and, where
// that does not end the machine, powers it off.
func exit(status byte) {
	syscall.Sync()
	if p, err := os.OpenFile("/dev/port", os.O_WRONLY, 0); err == nil {
		p.WriteAt([]byte{status}, debugExitPort)
		p.Close()
	}
	_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	select {} // init must not exit
}
