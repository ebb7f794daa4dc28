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
script the way sbatch does (arguments split and quoted as sbatch's parser does, "--opt=V" and
"--opt V", signals by name or number, only the lines before the first command), and the
defaults for them come from the script pswift renders (it always has --open-mode=append, and
--signal=USR2@T whenever there is a time limit).
Other jobs pass untouched.
]]

local NO_VAL16 = 65534

local function is_pswift(job_desc)
   return job_desc.script ~= nil and string.find(job_desc.script, "pipeswift_launch", 1, true) ~= nil
end

-- The #SBATCH lines sbatch reads: up to the first line that is neither blank nor a comment.
local function sbatch_lines(script)
   local lines = {}
   for line in string.gmatch(script, "[^\n]+") do
      if string.sub(line, 1, 7) == "#SBATCH" then
         table.insert(lines, string.sub(line, 8))
      elseif not string.match(line, "^%s*#") and string.match(line, "%S") then
         break
      end
   end
   return lines
end

-- Split one #SBATCH line into arguments as sbatch's get_argument() does: whitespace separates,
-- ' or " group (a backslash escapes the next character, inside quotes too), an unquoted #
-- starts a comment.
local function arguments(line)
   local args, cur, quote, i, n = {}, nil, nil, 1, #line
   while i <= n do
      local c = string.sub(line, i, i)
      if c == "\\" then
         i = i + 1
         cur = (cur or "") .. string.sub(line, i, i)
      elseif quote then
         if c == quote then quote = nil else cur = (cur or "") .. c end
      elseif c == "'" or c == '"' then
         quote, cur = c, cur or ""
      elseif c == "#" then
         break
      elseif string.match(c, "%s") then
         if cur then table.insert(args, cur); cur = nil end
      else
         cur = (cur or "") .. c
      end
      i = i + 1
   end
   if cur then table.insert(args, cur) end
   return args
end

-- Every value the script gives option --name, written "--name=V" or "--name V".
local function option_values(script, name)
   local out, long = {}, "--" .. name
   for _, line in ipairs(sbatch_lines(script)) do
      local args = arguments(line)
      local k = 1
      while k <= #args do
         local a = args[k]
         if a == long and args[k + 1] ~= nil then
            table.insert(out, args[k + 1])
            k = k + 1
         elseif string.sub(a, 1, #long + 1) == long .. "=" then
            table.insert(out, string.sub(a, #long + 2))
         end
         k = k + 1
      end
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
   for _, spec in ipairs(option_values(job_desc.script, "signal")) do
      if is_usr1(spec) then
         slurm.log_user("pswift: --signal with SIGUSR1 conflicts with NCCL; pswift checkpoints on USR2 (use --signal=USR2@SECONDS)")
         return slurm.ERROR
      end
   end
   for _, mode in ipairs(option_values(job_desc.script, "open-mode")) do
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
