/* The pod sandbox's process: holds the pod's namespaces, reaps orphans, exits on SIGTERM/SIGINT.
   Built with `gcc -static` by testbed/oci.py; containerd runs it as its sandbox_image. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { _exit(sig == SIGTERM || sig == SIGINT ? 0 : 1); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
  signal(SIGTERM, stop); signal(SIGINT, stop); signal(SIGCHLD, reap);
  for (;;) pause();
}
