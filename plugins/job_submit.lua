--[[
pswift job_submit.lua: slurmctld runs slurm_job_submit() for every submission, under its locks,
so this is fast and does no I/O.

For pswift jobs (batch scripts that start `pipeswift_launch`):
  * adds --requeue when the request did not say (preemption in REQUEUE mode and the job's own
    `scontrol requeue` need it);
  * rejects contradictions, with a message the user sees at sbatch time:
      --no-requeue                    (a preempted pswift job must come back),
      --signal with SIGUSR1           (NCCL may catch it; pswift listens to USR2),
      --open-mode=truncate            (a requeued attempt would erase the earlier attempts' log).
Slurm 22.05's Lua interface cannot read or set open_mode, warn_signal or warn_time
("_set_job_field: unrecognized field"), so those two checks read the #SBATCH lines of the
script the way sbatch does: only the lines before the first command; arguments split and quoted
as sbatch's get_argument() splits them; options matched as getopt_long matches them (a unique
prefix of a long option is that option, "--opt=V" and "--opt V", an option that takes a value
consumes the next argument, short options and their clusters); signals by name or number. The

defaults for them come from the script pswift renders (it always has --open-mode=append, and
--signal=USR2@T whenever there is a time limit).
Other jobs pass untouched.
]]

local NO_VAL16 = 65534

-- Bounds: every step below is linear in the script's size (string.find spans, table buffers,
-- never a string grown one character at a time), and the work is capped: a #SBATCH line longer
-- than MAX_LINE bytes is skipped; quoted or escaped lines (the slow path) are read up to
-- MAX_QUOTED bytes in all, and at most MAX_ARGS arguments. Past a cap the rest of the directives
-- go unchecked (one log line; sbatch still applies them): the checks guard a user against a
-- mistake in their own job, and no script can hold slurmctld for more than a few milliseconds.
-- pswift's own scripts are far below every cap (bench/job_submit.py measures the time).
local MAX_LINE, MAX_QUOTED, MAX_ARGS = 65536, 16384, 4096

-- sbatch's long options (Slurm 25.11.7's `sbatch --autocomplete=--`; 22.05's are a subset).
-- Those that take a value read it from "--opt=V" or from the next argument.
local TAKES_VALUE = {
   "account", "acctg-freq", "array", "autocomplete", "batch", "bb", "bbf", "begin", "chdir",
   "cluster", "cluster-constraint", "clusters", "comment", "constraint", "container",
   "container-id", "context", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu",
   "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "error", "exclude",
   "export", "export-file", "extra", "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus",
   "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint", "input",
   "job-name", "kill-on-invalid-dep", "licenses", "mail-type", "mail-user", "mcs-label", "mem",
   "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nodefile", "nodelist",
   "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node",
   "ntasks-per-socket", "ntasks-per-tres", "open-mode", "output", "partition", "prefer",
   "priority", "profile", "qos", "reservation", "resources", "segment", "signal",
   "sockets-per-node", "switches", "tasks-per-node", "thread-spec", "threads-per-core", "time",
   "time-min", "tmp", "tres-bind", "tres-per-task", "uid", "wait-all-nodes", "wckey", "wrap"
}
local FLAGS = {   -- no value, or one given only as "--opt=V"
   "consolidate-segments", "contiguous", "exclusive", "external", "get-user-env", "help",
   "hold", "ignore-pbs", "nice", "no-kill", "no-requeue", "oom-kill-step", "overcommit",
   "oversubscribe", "parsable", "propagate", "quiet", "reboot", "requeue", "resv-ports",
   "spread-job", "spread-segments", "stepmgr", "test-only", "usage", "use-min-nodes",
   "verbose", "version", "wait"
}
-- short options that take a value ("-oFILE" or "-o FILE"), with their long names where a check
-- reads them; the others (-h -H -O -Q -s -v -V -W, -k's value only attached) take none
local SHORT_VALUE = {A = "account", a = "array", b = "begin", D = "chdir", M = "clusters",
   C = "constraint", S = "core-spec", c = "cpus-per-task", d = "dependency", m = "distribution",
   e = "error", x = "exclude", B = "extra-node-info", G = "gpus", i = "input", J = "job-name",
   L = "licenses", F = "nodefile", w = "nodelist", N = "nodes", n = "ntasks", o = "output",
   p = "partition", q = "qos", t = "time"}

-- every prefix of every long option -> that option, or false when several share it (getopt_long:
-- an exact name wins, a unique prefix abbreviates, an ambiguous one is refused by sbatch)
local LONG, TAKES = {}, {}
local function index_options(names, takes)
   for _, name in ipairs(names) do
      TAKES[name] = takes
      for k = 1, #name do
         local prefix = string.sub(name, 1, k)
         if LONG[prefix] == nil then LONG[prefix] = name
         elseif LONG[prefix] ~= name then LONG[prefix] = false end
      end
   end
end
index_options(TAKES_VALUE, true)
index_options(FLAGS, false)
for _, name in ipairs(TAKES_VALUE) do LONG[name] = name end
for _, name in ipairs(FLAGS) do LONG[name] = name end

local function is_pswift(job_desc)
   return job_desc.script ~= nil and string.find(job_desc.script, "pipeswift_launch", 1, true) ~= nil
end

-- A line where only spaces separate arguments (no quote, backslash, #, tab...): split with
-- plain string.find, which is memchr-fast (a character class costs ~40 ns a character in Lua).
local SPECIAL = {"\\", "'", '"', "#", "\t", "\r", "\v", "\f"}
local function is_simple(line)
   for _, c in ipairs(SPECIAL) do
      if string.find(line, c, 1, true) then return false end
   end
   return true
end

local function add_simple_arguments(line, args)
   local pos, n, k = 1, #line, #args
   while pos <= n and k <= MAX_ARGS do
      local stop = string.find(line, " ", pos, true) or (n + 1)
      if stop > pos then k = k + 1; args[k] = string.sub(line, pos, stop - 1) end
      pos = stop + 1
   end
end

-- Any other line, as sbatch's get_argument() splits it: whitespace separates; ' or " group; a
-- backslash makes the next character literal (inside quotes too); an unquoted # ends the line;
-- an empty argument ("") ends the line too, as in sbatch. Each piece is one string.sub between
-- string.find hits, so the work is linear in the line.
local function add_quoted_arguments(line, args)
   local pos, n = 1, #line
   while #args <= MAX_ARGS do
      pos = string.find(line, "%S", pos)
      if pos == nil then return end
      local buf, quote = {}, nil
      while pos <= n do
         local hit = string.find(line, quote == '"' and '[\\"]' or quote == "'" and "[\\']"
                                 or "[%s\\'\"#]", pos)
         if hit == nil then
            if quote then return end   -- unmatched quote: sbatch refuses the script
            buf[#buf + 1] = string.sub(line, pos)
            pos = n + 1
            break
         end
         if hit > pos then buf[#buf + 1] = string.sub(line, pos, hit - 1) end
         local c = string.sub(line, hit, hit)
         if c == "\\" then
            buf[#buf + 1] = string.sub(line, hit + 1, hit + 1)
            pos = hit + 2
         elseif quote then
            quote, pos = nil, hit + 1   -- the closing quote
         elseif c == "'" or c == '"' then
            quote, pos = c, hit + 1
         elseif c == "#" then
            if #buf > 0 then args[#args + 1] = table.concat(buf) end
            return
         else
            pos = hit   -- whitespace ends this argument
            break
         end
      end
      if #buf == 0 then return end
      args[#args + 1] = table.concat(buf)
   end
end

-- The arguments sbatch reads from the script: those of the #SBATCH lines up to the first line
-- that is neither blank nor a comment. Lines are found with plain string.find; only #SBATCH
-- lines are copied, each at most MAX_LINE bytes.
local function script_arguments(script, job_name)
   local args, pos, n, quoted = {}, 1, #script, 0
   local function over(what)
      slurm.log_info("pswift job_submit: job %s: %s; the rest of its #SBATCH lines go unchecked",
                     tostring(job_name), what)
   end
   while pos <= n do
      local stop = string.find(script, "\n", pos, true) or (n + 1)
      if string.sub(script, pos, pos + 6) == "#SBATCH" then
         local line = stop - pos <= MAX_LINE and string.sub(script, pos + 7, stop - 1)
         if not line then
            slurm.log_info("pswift job_submit: job %s: skipped a #SBATCH line of %d bytes (over %d)",
                           tostring(job_name), stop - pos, MAX_LINE)
         elseif is_simple(line) then
            add_simple_arguments(line, args)
         elseif quoted + #line > MAX_QUOTED then
            over(string.format("quoted or escaped #SBATCH lines over %d bytes", MAX_QUOTED)); break
         else
            quoted = quoted + #line
            add_quoted_arguments(line, args)
         end
         if #args > MAX_ARGS then
            over(string.format("over %d #SBATCH arguments", MAX_ARGS)); break
         end
      else
         local first = string.find(script, "%S", pos)   -- blank line, comment, or the first command
         if first ~= nil and first < stop and string.byte(script, first) ~= 35 then break end
      end
      pos = stop + 1
   end
   return args
end

-- {option = {values...}} for the long options in `wanted`, as getopt_long reads `args`.
local function option_values(args, wanted)
   local out, k, n = {}, 1, #args
   for name in pairs(wanted) do out[name] = {} end
   local function found(name, value)
      if out[name] and value ~= nil then table.insert(out[name], value) end
   end
   while k <= n do
      local a = args[k]
      if a == "--" then break end
      if string.sub(a, 1, 2) == "--" then
         local eq = string.find(a, "=", 3, true)
         local name = LONG[string.sub(a, 3, (eq or 0) - 1)]
         if name and eq then
            found(name, string.sub(a, eq + 1))
         elseif name and TAKES[name] then
            found(name, args[k + 1])
            k = k + 1
         end
      elseif string.sub(a, 1, 1) == "-" and #a > 1 then
         local j = 2   -- a cluster of short options: flags, then at most one taking a value
         while j <= #a do
            local long = SHORT_VALUE[string.sub(a, j, j)]
            if long then
               if j < #a then found(long, string.sub(a, j + 1)) else found(long, args[k + 1]); k = k + 1 end
               break
            end
            j = j + 1
         end
      end
      k = k + 1
   end
   return out
end

-- --signal=[{R|B}:]<sig>[@time]: SIGUSR1 by name or number (10 on Linux)
local function is_usr1(spec)
   local sig = string.upper(spec)
   sig = (string.gsub(sig, "^[RB]+:", ""))
   sig = (string.gsub(sig, "@.*$", ""))
   return sig == "USR1" or sig == "SIGUSR1" or sig == "10"
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if not is_pswift(job_desc) then
      return slurm.SUCCESS
   end
   if job_desc.requeue == 0 then
      slurm.log_user("pswift: this pipeswift job asks --no-requeue, but a preempted or timed-out pswift job must be requeued to resume from its checkpoint; drop --no-requeue")
      return slurm.ERROR
   end
   local given = option_values(script_arguments(job_desc.script, job_desc.name),
                               {["signal"] = true, ["open-mode"] = true})
   for _, spec in ipairs(given["signal"]) do
      if is_usr1(spec) then
         slurm.log_user("pswift: --signal with SIGUSR1 conflicts with NCCL; pswift checkpoints on USR2 (use --signal=USR2@SECONDS)")
         return slurm.ERROR
      end
   end
   for _, mode in ipairs(given["open-mode"]) do
      if string.lower(mode) == "truncate" then
         slurm.log_user("pswift: --open-mode=truncate would erase the log of earlier attempts when the job is requeued; use --open-mode=append")
         return slurm.ERROR
      end
   end
   if job_desc.requeue == nil or job_desc.requeue == NO_VAL16 then
      job_desc.requeue = 1
      slurm.log_info("pswift job_submit: added --requeue to pswift job %s", tostring(job_desc.name))
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
