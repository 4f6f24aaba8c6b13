"""`program_tests`: correct C, C++ and JavaScript programs score 1; hostile ones score 0 or are contained.

Each attack prints the expected output only if it succeeds (it read a test's expected output, kept
state from an earlier run, reached the network…), so a score of 0 with the verdict "wrong_answer"
shows the attack ran and failed. A positive control runs the reading attack on the host, where it
does find the expected output.
"""
import os
import subprocess
import time
import uuid

import pytest

from lmrl.rewards import REWARD_FNS, program_tests, sandbox_root
from lmrl.rewards.program_tests import BINARY, extract_program, outputs_match, read_tests, run_tests
from lmrl.types import Sample

ADD_TESTS = [("3 4\n", "7\n"), ("10 -2\n", "8\n"), ("0 0", "0")]
C_ADD = '#include <stdio.h>\nint main(){long a,b;if(scanf("%ld %ld",&a,&b)!=2)return 1;printf("%ld\\n",a+b);}\n'
CPP_ADD = "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}\n"
JS_ADD = "const v=require('fs').readFileSync(0,'utf8').trim().split(/\\s+/).map(Number);console.log(v[0]+v[1]);\n"


def sample(text: str, language: str, tests) -> Sample:
    return Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0], text=text, row={"language": language, "tests": tests})


@pytest.mark.parametrize("language,program", [("c", C_ADD), ("cpp", CPP_ADD), ("javascript", JS_ADD), ("js", JS_ADD)])
def test_a_correct_program_scores_one_in_each_language(language, program):
    reply = f"Here is my answer.\n```text\nnot this one\n```\nFinal:\n```{language}\n{program}```\n"
    s = sample(reply, language, [{"input": i, "output": o} for i, o in ADD_TESTS])
    assert REWARD_FNS.get("program_tests")(s) == 1.0
    assert s.info["program_tests"]["verdicts"] == ["passed"] * 3


def test_partial_credit_counts_tests_and_all_or_nothing_does_not():
    wrong_on_zero = C_ADD.replace("a+b);", "a+b==0?1:a+b);")
    tests = [{"input": i, "output": o} for i, o in ADD_TESTS]
    fn = REWARD_FNS.get("program_tests")
    assert fn(sample(f"```c\n{wrong_on_zero}```", "c", tests)) == pytest.approx(2 / 3)
    assert fn(sample(f"```c\n{wrong_on_zero}```", "c", tests), partial_credit=False) == 0.0


def test_a_compile_error_is_a_verdict_of_zero():
    report = run_tests("int main() { return }", "c", ADD_TESTS)
    assert report["passed"] == 0 and report["status"] == "compile_error"
    assert "error" in report["detail"]


def test_output_rule_strips_trailing_whitespace_and_tolerates_floats_only_when_asked():
    assert outputs_match("1 2  \r\n3\n\n\n", "1 2\n3")
    assert not outputs_match("1  2\n3", "1 2\n3")  # inner whitespace is kept
    assert not outputs_match("0.3333", "0.333333")
    assert outputs_match("x 0.3333 y", "x 0.333333 y", float_tolerance=1e-3)  # |diff| 3.3e-5 <= 1e-3
    assert outputs_match("2000.1", "2000", float_tolerance=1e-4)  # 0.1 <= 1e-4 * 2000 = 0.2
    assert not outputs_match("2000.5", "2000", float_tolerance=1e-4)  # 0.5 > 0.2
    assert not outputs_match("x 0.3333", "y 0.333333", float_tolerance=1e-3)


def test_the_program_is_the_last_fenced_block():
    assert extract_program("```c\nfirst\n```\n```js\nsecond\n```") == "second\n"
    assert extract_program("intro\n```c\nunclosed") == "unclosed"
    assert extract_program("no fence") == "no fence"


def test_bad_rows_and_missing_tools_raise_with_the_fix():
    with pytest.raises(ValueError, match="language 'rust'"):
        run_tests("", "rust", ADD_TESTS)
    with pytest.raises(ValueError, match="non-empty list"):
        read_tests([])
    with pytest.raises(ValueError, match="test 0 must be"):
        read_tests([{"input": "1"}])
    assert read_tests('[{"input": "1", "output": "2"}]') == [("1", "2")]


def test_a_missing_compiler_names_its_debian_package(monkeypatch):
    gcc = program_tests.LANGUAGES["c"]
    missing = program_tests.Language(**{**gcc.__dict__, "packages": (("/nonexistent/gcc", "gcc"),)})
    monkeypatch.setitem(program_tests.LANGUAGES, "c", missing)
    with pytest.raises(RuntimeError, match=r"apt-get install gcc"):
        run_tests(C_ADD, "c", ADD_TESTS)


@pytest.fixture(scope="module")
def expected_on_the_host():
    """A test whose expected output is also in a world-readable host file (as a dataset would be)."""
    mark = f"EXPECTED-{uuid.uuid4().hex}"
    folder = f"/tmp/lmrl-expected-{uuid.uuid4().hex}"
    os.mkdir(folder, 0o755)
    path = os.path.join(folder, "expected.txt")
    with open(path, "w") as f:
        f.write(mark + "\n")
    os.chmod(path, 0o644)
    yield mark, path
    os.unlink(path)
    os.rmdir(folder)


READER = r'''
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static void find(int fd) {
    static char buf[1 << 16];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    for (ssize_t i = 0; n > 0 && i + 41 <= n; i++)
        if (!memcmp(buf + i, "EXPECTED-", 9)) { fwrite(buf + i, 1, 41, stdout); putchar('\n'); fflush(stdout); }
}
static void scan(const char *path) { int fd = open(path, O_RDONLY); if (fd >= 0) { find(fd); close(fd); } }
int main(void) {
    char p[512];
    scan("HOST_FILE"); snprintf(p, sizeof p, "/proc/1/root%s", "HOST_FILE"); scan(p);
    scan("/proc/self/cwd/../../HOST_FILE");
    DIR *d = opendir("/proc"); struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *kinds[] = {"cmdline", "environ", "mem"};
        for (int k = 0; k < 3; k++) { snprintf(p, sizeof p, "/proc/%s/%s", e->d_name, kinds[k]); scan(p); }
    }
    for (int fd = 0; fd < 256; fd++) { lseek(fd, 0, SEEK_SET); find(fd); }
    return 0;
}
'''


def test_no_trick_reads_the_expected_output(expected_on_the_host, tmp_path):
    mark, path = expected_on_the_host
    program = READER.replace("HOST_FILE", path)
    report = run_tests(program, "c", [("", mark + "\n")])
    assert report["passed"] == 0 and report["verdicts"] == ["wrong_answer"]
    # positive control: the same program run on the host finds it
    (tmp_path / "r.c").write_text(program)
    subprocess.run(["gcc", "-O1", "-o", str(tmp_path / "r"), str(tmp_path / "r.c")], check=True)
    assert mark in subprocess.run([str(tmp_path / "r")], capture_output=True, text=True, stdin=subprocess.DEVNULL).stdout


PATHS = r'''
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(void) {
    const char *paths[] = {"PROJECT", "/work", "/root", "/home", "/etc/passwd", "/bin/sh", "/usr/bin/gcc",
                           "/usr/include/stdio.h", "/usr/bin/node", 0};
    for (int i = 0; paths[i]; i++) if (access(paths[i], F_OK) == 0) printf("visible %s\n", paths[i]);
    int shell = system("cat /proc/1/environ");
    printf("%s\n", shell == 0 ? "shell ran" : "no shell");
    return 0;
}
'''


def test_the_run_sees_neither_the_project_nor_the_toolchain_nor_a_shell():
    project = os.path.realpath(program_tests.__file__)
    report = run_tests(PATHS.replace("PROJECT", project), "c", [("", "no shell\n")])
    assert report["verdicts"] == ["passed"]  # nothing of the list is visible, system() finds no /bin/sh


STATEFUL = r'''
#include <stdio.h>
int main(void) {
    const char *places[] = {"/sandbox/seen", "/tmp/seen", "/dev/shm/seen", 0};
    char seen[256] = "", now[256] = "";
    for (int i = 0; places[i] && !seen[0]; i++) { FILE *f = fopen(places[i], "r"); if (f) { fgets(seen, 256, f); fclose(f); } }
    if (scanf("%255s", now) != 1) return 1;
    for (int i = 0; places[i]; i++) { FILE *f = fopen(places[i], "w"); if (f) { fputs(now, f); fclose(f); } }
    printf("%s\n", seen[0] ? seen : "nothing seen");
    return 0;
}
'''


def test_nothing_written_in_one_run_reaches_the_next():
    # test k expects the input of test k-1: only a program that kept state between runs passes tests 2 and 3
    tests = [("alpha", "nothing seen"), ("bravo", "alpha"), ("charlie", "bravo")]
    report = run_tests(STATEFUL, "c", tests)
    assert report["verdicts"] == ["passed", "wrong_answer", "wrong_answer"]


def test_a_fork_bomb_is_contained_and_leaves_no_process():
    bomb = "#include <unistd.h>\nint main(void){for(;;)fork();}\n"
    start = time.monotonic()
    report = run_tests(bomb, "c", [("", "x")], test_timeout_s=1.0)
    assert report["passed"] == 0 and report["verdicts"][0] in ("timeout", "runtime_error")
    assert time.monotonic() - start < 15
    deadline = time.monotonic() + 5.0  # a killed PID namespace's processes are reaped by the kernel: on a loaded
    while bomb_processes() and time.monotonic() < deadline:  # machine that can take a moment after the kill
        time.sleep(0.1)
    assert bomb_processes() == 0


def bomb_processes() -> int:
    """Live processes of the sandbox user running the compiled program (other tests' sandboxes, run by another
    worker at the same time, are not counted)."""
    found = 0
    for entry in (e for e in os.listdir("/proc") if e.isdigit()):
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        found += fields.get("Name", "").strip() == BINARY and fields.get("Uid", "-1").split()[0] == "65534"
    return found


def test_no_network_from_c_or_node():
    c = r'''
#include <arpa/inet.h>
#include <stdio.h>
#include <sys/socket.h>
int main(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(53)};
    inet_pton(AF_INET, "1.1.1.1", &a.sin_addr);
    puts(s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0 ? "connected" : "offline");
}
'''
    assert run_tests(c, "c", [("", "connected")])["verdicts"] == ["wrong_answer"]
    js = ("const s=require('net').connect(53,'1.1.1.1',()=>{console.log('connected');process.exit(0)});"
          "s.on('error',()=>{console.log('offline')});")
    assert run_tests(js, "javascript", [("", "connected")])["verdicts"] == ["wrong_answer"]


def test_endless_loop_huge_allocation_and_huge_output_get_their_verdicts():
    loop = "int main(void){volatile long i=0;for(;;)i++;}\n"
    alloc = ('#include <stdlib.h>\n#include <string.h>\n#include <stdio.h>\nint main(void){size_t n=4UL<<30;'
             'char*p=malloc(n);if(!p)return 3;memset(p,1,n);puts("ok");}\n')
    flood = '#include <stdio.h>\nint main(void){for(;;)puts("ok ok ok ok ok ok ok ok");}\n'
    assert run_tests(loop, "c", [("", "x")], test_timeout_s=1.0)["verdicts"] == ["timeout"]
    assert run_tests(alloc, "c", [("", "ok")])["verdicts"] == ["runtime_error"]
    assert run_tests(flood, "c", [("", "ok")], max_output_bytes=10_000)["verdicts"] == ["output_limit"]
    js_alloc = "const a=[];for(;;)a.push(new Array(1e6).fill(1));"
    assert run_tests(js_alloc, "javascript", [("", "x")])["verdicts"] in (["runtime_error"], ["timeout"])


def test_node_reads_no_file_spawns_nothing_and_has_a_bare_environment(expected_on_the_host):
    mark, path = expected_on_the_host
    js = f"""
const fs = require('fs'), out = [];
for (const p of [{path!r}, '/proc/1/environ', '/proc/self/environ']) {{
  try {{ out.push(fs.readFileSync(p, 'utf8')); }} catch (e) {{ out.push(e.code); }}
}}
try {{ out.push(require('child_process').execSync('cat {path}').toString()); }} catch (e) {{ out.push(e.code); }}
out.push(Object.keys(process.env).sort().join(','));
console.log(out.join('\\n'));
"""
    report = run_tests(js, "javascript", [("", mark)])
    assert report["verdicts"] == ["wrong_answer"]
    expected = "ERR_ACCESS_DENIED\n" * 4 + "HOME,LANG,PATH,PWD,TMPDIR"
    assert run_tests(js, "javascript", [("", expected)])["verdicts"] == ["passed"]


def test_a_tool_layout_binds_the_declared_paths_with_their_links_and_hides_site_packages():
    view = sandbox_root.tool_layout(("/usr/bin/gcc", "/usr/include"))
    target = os.path.realpath("/usr/bin/gcc")
    assert target in view.binds and "/usr/include" in view.binds
    assert (os.readlink("/usr/bin/gcc"), "/usr/bin/gcc") in view.links
    assert not any(b.startswith(("/work", "/root", "/tmp")) for b in view.binds)
    assert "/usr/lib/python3/dist-packages" in view.masks
    with pytest.raises(RuntimeError, match="does not exist"):
        sandbox_root.tool_layout(("/usr/bin/no-such-compiler",))


def test_a_run_sees_site_packages_empty():
    lister = ('#include <dirent.h>\n#include <stdio.h>\nint main(void){DIR*d=opendir("/usr/lib/python3/dist-packages");'
              'int n=0;struct dirent*e;while(d&&(e=readdir(d)))n++;printf("%s %d\\n",d?"open":"absent",n);}\n')
    assert run_tests(lister, "c", [("", "open 2")])["verdicts"] == ["passed"]  # only . and ..


def test_the_compile_step_cannot_embed_a_host_file(expected_on_the_host, tmp_path):
    mark, path = expected_on_the_host
    program = ('#include <stdio.h>\n__asm__(".section .rodata\\n.global blob\\nblob:\\n.incbin \\"' + path +
               '\\"\\n.byte 0\\n.text\\n");\nextern const char blob[];\nint main(void){fputs(blob, stdout);}\n')
    report = run_tests(program, "c", [("", mark)])
    assert report["status"] == "compile_error" and report["passed"] == 0
    # positive control: compiled on the host, the program prints the file
    (tmp_path / "e.c").write_text(program)
    subprocess.run(["gcc", "-O1", "-o", str(tmp_path / "e"), str(tmp_path / "e.c")], check=True)
    assert mark in subprocess.run([str(tmp_path / "e")], capture_output=True, text=True).stdout
